/**
 * Checkpoints: `<run>/checkpoints/step-NNNNNNNN/` holding the model as a Hugging Face folder
 * (model.safetensors + config.json + tokenizer files, loadable by transformers), the AdamW moments
 * (optimizer.safetensors), LoRA adapters when training them (adapter_model.safetensors), the run's
 * config (config.yaml) and the trainer state (step, data position, seed). A checkpoint is written into a temporary folder and renamed into place, so a
 * crash leaves the previous checkpoints intact and never a half-written one under a step name.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CausalLM, readSafetensorsHeader, readTensorBytes, writeSafetensors, type DecoderConfig } from '@lathe/models';
import { bytesToFloat32 } from '@lathe/runtime';
import { fullTrainableParams, type TrainableParam } from './train-step';

/** Where a run is in its data and schedule. */
export interface TrainerState {
  /** Optimizer steps completed. */
  step: number;
  /** Training examples consumed (the data stream's position). */
  dataPosition: number;
  /** The run's seed (data order depends only on it and the position). */
  seed: number;
}

/** Everything a checkpoint holds. */
export interface CheckpointContents {
  config: DecoderConfig;
  /** The model's float32 weights by HF name (with LoRA: the base with the adapters merged in). */
  model: Map<string, Float32Array>;
  /** The trained tensors: every model weight in full fine-tuning, the adapters with LoRA. */
  trainable: TrainableParam[];
  /** Their values (for full fine-tuning, the same arrays as `model`). */
  values: Map<string, Float32Array>;
  /** AdamW first and second moments by trainable name. */
  m: Map<string, Float32Array>;
  v: Map<string, Float32Array>;
  state: TrainerState;
  /** The run config as YAML text. */
  runConfigYaml: string;
  /** True when `trainable` are LoRA adapters (saved to adapter_model.safetensors). */
  lora: boolean;
}

const STEP_DIR = /^step-(\d{8})$/;

/** The folder name of a step's checkpoint. */
export function checkpointName(step: number): string {
  return `step-${String(step).padStart(8, '0')}`;
}

/** Complete checkpoints of a run, oldest first. */
export function listCheckpoints(runDir: string): { step: number; dir: string }[] {
  const root = join(runDir, 'checkpoints');
  if (!existsSync(root)) return [];
  return readdirSync(root)
    .map((name) => ({ m: STEP_DIR.exec(name), name }))
    .filter((e) => e.m && existsSync(join(root, e.name, 'trainer_state.json')))
    .map((e) => ({ step: Number(e.m![1]), dir: join(root, e.name) }))
    .sort((a, b) => a.step - b.step);
}

const asBytes = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** Writes a checkpoint atomically and deletes all but the newest `keepLast`. Returns its folder. */
export function saveCheckpoint(runDir: string, c: CheckpointContents, opts: { keepLast: number; tokenizerFrom?: string }): string {
  const root = join(runDir, 'checkpoints');
  mkdirSync(root, { recursive: true });
  const final = join(root, checkpointName(c.state.step));
  const tmp = join(root, `.${checkpointName(c.state.step)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  const tensors = (specs: { name: string; shape: number[] }[], src: Map<string, Float32Array>, prefix = '') =>
    specs.map((s) => {
      const data = src.get(s.name);
      if (!data) throw new Error(`checkpoint: missing tensor '${prefix}${s.name}'`);
      return { name: prefix + s.name, dtype: 'float32' as const, shape: s.shape, data: asBytes(data) };
    });
  CausalLM.fromWeights(c.config, c.model).save(tmp, { dtype: 'float32', tokenizerFrom: opts.tokenizerFrom });
  if (c.lora) writeSafetensors(join(tmp, 'adapter_model.safetensors'), tensors(c.trainable, c.values), { format: 'pt' });
  writeSafetensors(join(tmp, 'optimizer.safetensors'), [...tensors(c.trainable, c.m, 'adam_m/'), ...tensors(c.trainable, c.v, 'adam_v/')], { format: 'lathe-adamw' });
  writeFileSync(join(tmp, 'config.yaml'), c.runConfigYaml);
  writeFileSync(join(tmp, 'trainer_state.json'), JSON.stringify(c.state, null, 2) + '\n');
  if (existsSync(final)) rmSync(final, { recursive: true, force: true });
  renameSync(tmp, final);
  const all = listCheckpoints(runDir);
  for (const old of all.slice(0, Math.max(0, all.length - opts.keepLast))) rmSync(old.dir, { recursive: true, force: true });
  return final;
}

/** Reads a checkpoint folder written by `saveCheckpoint`; `trainable` says which tensors were trained. */
export function loadCheckpoint(dir: string, trainable?: TrainableParam[]): CheckpointContents {
  const statePath = join(dir, 'trainer_state.json');
  if (!existsSync(statePath)) throw new Error(`${dir}: not a checkpoint (no trainer_state.json)`);
  const state = JSON.parse(readFileSync(statePath, 'utf8')) as TrainerState;
  for (const k of ['step', 'dataPosition', 'seed'] as const) {
    if (typeof state[k] !== 'number') throw new Error(`${statePath}: field '${k}' must be a number`);
  }
  const checkpointModel = CausalLM.fromPretrainedSync(dir);
  const config = checkpointModel.config;
  const model = checkpointModel.float32Weights();
  const lora = existsSync(join(dir, 'adapter_model.safetensors'));
  const specs = trainable ?? fullTrainableParams(config);
  const readAll = (file: string) => new Map(readSafetensorsHeader(join(dir, file)).tensors.map((t) => [t.name, t]));
  const adapterFile = lora ? readAll('adapter_model.safetensors') : undefined;
  const opt = readAll('optimizer.safetensors');
  const values = new Map<string, Float32Array>();
  const m = new Map<string, Float32Array>();
  const v = new Map<string, Float32Array>();
  for (const s of specs) {
    if (adapterFile) {
      const e = adapterFile.get(s.name);
      if (!e) throw new Error(`${join(dir, 'adapter_model.safetensors')}: missing tensor '${s.name}'`);
      values.set(s.name, bytesToFloat32(readTensorBytes(e), e.dtype, `${e.file}: '${e.name}'`));
    } else {
      const w = model.get(s.name);
      if (!w) throw new Error(`${dir}: missing trained tensor '${s.name}' (a LoRA run resumed from a full fine-tuning checkpoint, or the reverse?)`);
      values.set(s.name, w);
    }
    for (const [prefix, into] of [['adam_m/', m], ['adam_v/', v]] as const) {
      const e = opt.get(prefix + s.name);
      if (!e) throw new Error(`${join(dir, 'optimizer.safetensors')}: missing tensor '${prefix}${s.name}'`);
      into.set(s.name, bytesToFloat32(readTensorBytes(e), e.dtype, `${e.file}: '${e.name}'`));
    }
  }
  return { config, model, trainable: specs, values, m, v, state, runConfigYaml: readFileSync(join(dir, 'config.yaml'), 'utf8'), lora };
}
