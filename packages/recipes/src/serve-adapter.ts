/**
 * `lathe serve --model DIR` where DIR is a PEFT LoRA adapter folder (adapter_config.json +
 * adapter_model.safetensors, as `lathe sft`/`lathe grpo` checkpoints and PEFT write them): the base
 * model its `base_model_name_or_path` names, with W += (lora_alpha / r)·B·A merged into every
 * adapted weight at load, so the served graphs are the plain decoder's.
 */
import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, join, resolve } from 'node:path';
import { CausalLM, readSafetensorsHeader, readTensorBytes, type CausalLMOptions } from '@lathe/models';
import { bytesToFloat32 } from '@lathe/runtime';
import { mergeLora, type LoraAdapter } from '@lathe/train';

/** What adapter_config.json says about merging. */
interface AdapterConfig {
  base: string;
  rank: number;
  alpha: number;
}

/** Whether `dir` is an adapter folder (an adapter_config.json and no config.json of its own). */
export function isAdapterFolder(dir: string): boolean {
  return existsSync(join(dir, 'adapter_config.json')) && !existsSync(join(dir, 'config.json'));
}

/** The adapter folder's config; its base folder resolved (relative to the adapter folder when not absolute). Errors name the file and field. */
export function readAdapterConfig(dir: string): AdapterConfig {
  const file = join(dir, 'adapter_config.json');
  let raw: { base_model_name_or_path?: unknown; r?: unknown; lora_alpha?: unknown; peft_type?: unknown; use_dora?: unknown };
  try {
    raw = JSON.parse(readFileSync(file, 'utf8')) as typeof raw;
  } catch (e) {
    throw new Error(`${file}: not readable JSON (${(e as Error).message})`);
  }
  if (raw.peft_type !== undefined && raw.peft_type !== 'LORA') throw new Error(`${file}: peft_type is ${JSON.stringify(raw.peft_type)}; only LORA adapters can be merged`);
  if (raw.use_dora === true) throw new Error(`${file}: use_dora is true; DoRA adapters are not supported (merge them with PEFT and serve the merged folder)`);
  if (typeof raw.r !== 'number' || !Number.isInteger(raw.r) || raw.r < 1) throw new Error(`${file}: r should be a positive integer, got ${JSON.stringify(raw.r)}`);
  if (typeof raw.lora_alpha !== 'number' || !Number.isFinite(raw.lora_alpha)) throw new Error(`${file}: lora_alpha should be a number, got ${JSON.stringify(raw.lora_alpha)}`);
  if (typeof raw.base_model_name_or_path !== 'string' || raw.base_model_name_or_path === '') throw new Error(`${file}: base_model_name_or_path should name the base model's folder`);
  const base = isAbsolute(raw.base_model_name_or_path) ? raw.base_model_name_or_path : resolve(dir, raw.base_model_name_or_path);
  if (!existsSync(join(base, 'config.json'))) {
    throw new Error(`${file}: base_model_name_or_path '${raw.base_model_name_or_path}' is not a model folder here (no ${join(base, 'config.json')}); set it to the base folder's path (absolute, or relative to the adapter folder)`);
  }
  return { base, rank: raw.r, alpha: raw.lora_alpha };
}

/**
 * The adapter folder's base with the adapters merged in, onto `opts.device` in `opts.dtype`.
 * Tensor names are PEFT's, with or without its `base_model.model.` prefix.
 */
export function loadAdapterMerged(dir: string, opts: CausalLMOptions = {}): CausalLM {
  const cfg = readAdapterConfig(dir);
  const file = join(dir, 'adapter_model.safetensors');
  if (!existsSync(file)) throw new Error(`${dir}: no adapter_model.safetensors beside adapter_config.json`);
  const base = CausalLM.fromPretrainedSync(cfg.base);
  const weights = base.float32Weights();
  base.dispose();
  const tensors = new Map(readSafetensorsHeader(file).tensors.map((t) => [t.name.replace(/^base_model\.model\./, ''), t] as const));
  const values = new Map<string, Float32Array>();
  const adapters: LoraAdapter[] = [];
  for (const [name, a] of tensors) {
    if (!name.endsWith('.lora_A.weight')) continue;
    const module = name.slice(0, -'.lora_A.weight'.length);
    const b = tensors.get(`${module}.lora_B.weight`);
    const target = `${module}.weight`;
    const w = weights.get(target);
    if (!b) throw new Error(`${file}: '${a.name}' has no lora_B beside it`);
    if (!w) throw new Error(`${file}: '${a.name}' adapts '${target}', which ${cfg.base} does not have`);
    const [out, inn] = [b.shape[0], a.shape[1]];
    if (a.shape[0] !== cfg.rank || b.shape[1] !== cfg.rank || out * inn !== w.length) {
      throw new Error(`${file}: '${module}' has A [${a.shape}] and B [${b.shape}]; r is ${cfg.rank} and '${target}' has ${w.length} elements`);
    }
    values.set(a.name, bytesToFloat32(readTensorBytes(a), a.dtype, `${file}: '${a.name}'`));
    values.set(b.name, bytesToFloat32(readTensorBytes(b), b.dtype, `${file}: '${b.name}'`));
    adapters.push({ target, a: { name: a.name, shape: a.shape, decay: false }, b: { name: b.name, shape: b.shape, decay: false } });
  }
  if (adapters.length === 0) throw new Error(`${file}: no LoRA tensors (<module>.lora_A.weight / lora_B.weight)`);
  const merged = mergeLora(weights, values, adapters, { rank: cfg.rank, alpha: cfg.alpha, targets: '' });
  return CausalLM.fromWeights(base.config, merged, opts);
}
