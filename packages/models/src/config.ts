/**
 * Decoder configuration read from a Hugging Face config.json (Qwen3, Qwen2 and Llama, as causal LMs
 * or as sequence classifiers, i.e. reward models). Unknown architectures and missing fields are
 * errors that name the file and field.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Architectures Lathe builds: a causal LM (head `lm_head`), or the same decoder with a `score`
 * Linear instead (…ForSequenceClassification: reward models, read at the last non-pad token).
 */
export type Architecture =
  | 'Qwen3ForCausalLM'
  | 'Qwen2ForCausalLM'
  | 'LlamaForCausalLM'
  | 'Qwen3ForSequenceClassification'
  | 'Qwen2ForSequenceClassification'
  | 'LlamaForSequenceClassification';
const ARCHITECTURES: Architecture[] = [
  'Qwen3ForCausalLM',
  'Qwen2ForCausalLM',
  'LlamaForCausalLM',
  'Qwen3ForSequenceClassification',
  'Qwen2ForSequenceClassification',
  'LlamaForSequenceClassification',
];

/** The model family of an architecture (what decides biases, QK-norm and model_type). */
export function architectureFamily(arch: Architecture): 'qwen3' | 'qwen2' | 'llama' {
  return arch.startsWith('Qwen3') ? 'qwen3' : arch.startsWith('Qwen2') ? 'qwen2' : 'llama';
}

/** RoPE frequency scaling (the variants these model families ship with). */
export type RopeScaling =
  | { type: 'default' }
  | { type: 'linear'; factor: number }
  | { type: 'llama3'; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number }
  | {
      type: 'yarn';
      factor: number;
      originalMaxPositionEmbeddings: number;
      betaFast: number;
      betaSlow: number;
      attentionFactor?: number;
      /** Round the ramp's ends to whole dimensions (transformers' `truncate`, default true). */
      truncate?: boolean;
      /** DeepSeek-style `mscale` / `mscale_all_dim`: with both, the attention factor is their ratio. */
      mscale?: number;
      mscaleAllDim?: number;
    };

/** Everything the decoder graph needs, with HF's names mapped to camelCase. */
export interface DecoderConfig {
  architecture: Architecture;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** Bias on q/k/v projections (always for Qwen2; Llama's and Qwen3's `attention_bias`, which also biases o_proj). */
  attentionBias: boolean;
  /** Bias on o_proj (Llama's and Qwen3's `attention_bias`). */
  outputBias: boolean;
  /** Bias on the MLP projections (Llama's `mlp_bias`). */
  mlpBias: boolean;
  /** Per-head RMSNorm of queries and keys before RoPE (Qwen3). */
  qkNorm: boolean;
  /**
   * Outputs of the `score` head of a …ForSequenceClassification model (transformers' `num_labels`:
   * 1 for a reward model); absent for a causal LM, whose head is `lm_head`.
   */
  scoreLabels?: number;
  /** Token ids from config.json (may be absent). */
  bosTokenId?: number;
  eosTokenId?: number | number[];
  /** transformers' sequence classifiers find each row's last token through it when batching. */
  padTokenId?: number;
  /** Dtype the weights are stored in (`torch_dtype`/`dtype`), when given. */
  torchDtype?: string;
}

/** A config.json object. */
export type HfConfig = Record<string, unknown>;

/** Error in a model folder, naming the file and field. */
export class ModelConfigError extends Error {
  override name = 'ModelConfigError';
}

function field<T>(cfg: HfConfig, key: string, kind: 'number' | 'boolean' | 'string', where: string, fallback?: T): T {
  const v = cfg[key];
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ModelConfigError(`${where}: missing field '${key}'`);
  }
  if (typeof v !== kind) throw new ModelConfigError(`${where}: field '${key}' should be a ${kind}, got ${JSON.stringify(v)}`);
  return v as T;
}

/**
 * transformers ≥ 5 writes RoPE settings as `rope_parameters` ({rope_type, rope_theta, factor, …});
 * earlier versions as top-level `rope_theta` plus `rope_scaling`. Both are read.
 */
function ropeParameters(cfg: HfConfig): Record<string, unknown> | undefined {
  const rp = cfg.rope_parameters;
  return rp && typeof rp === 'object' && !Array.isArray(rp) ? (rp as Record<string, unknown>) : undefined;
}

function ropeScaling(cfg: HfConfig, where: string): RopeScaling {
  const rp = ropeParameters(cfg);
  const rs = (rp && (rp.rope_type ?? rp.type) !== undefined ? rp : (cfg.rope_scaling ?? null)) as Record<string, unknown> | null;
  if (!rs) return { type: 'default' };
  const type = (rs.rope_type ?? rs.type) as string | undefined;
  const num = (k: string, fallback?: number) => field<number>(rs, k, 'number', `${where} rope_scaling`, fallback);
  switch (type) {
    case 'default':
      return { type: 'default' };
    case 'linear':
      return { type: 'linear', factor: num('factor') };
    case 'llama3':
      return {
        type: 'llama3',
        factor: num('factor'),
        lowFreqFactor: num('low_freq_factor'),
        highFreqFactor: num('high_freq_factor'),
        originalMaxPositionEmbeddings: num('original_max_position_embeddings'),
      };
    case 'yarn':
      return {
        type: 'yarn',
        factor: num('factor'),
        originalMaxPositionEmbeddings: num('original_max_position_embeddings', field<number>(cfg, 'max_position_embeddings', 'number', where)),
        betaFast: num('beta_fast', 32),
        betaSlow: num('beta_slow', 1),
        attentionFactor: typeof rs.attention_factor === 'number' ? rs.attention_factor : undefined,
        ...(typeof rs.truncate === 'boolean' ? { truncate: rs.truncate } : {}),
        ...(typeof rs.mscale === 'number' ? { mscale: rs.mscale } : {}),
        ...(typeof rs.mscale_all_dim === 'number' ? { mscaleAllDim: rs.mscale_all_dim } : {}),
      };
    case 'dynamic':
      // Dynamic NTK recomputes the frequencies from each batch's length, which a graph built once
      // (and a KV cache filled across calls) cannot follow.
      throw new ModelConfigError(`${where}: rope_scaling rope_type 'dynamic' (dynamic NTK) is not supported (supported: default, linear, llama3, yarn)`);
    default:
      throw new ModelConfigError(`${where}: rope_scaling rope_type '${type}' is not supported (supported: default, linear, llama3, yarn)`);
  }
}

/**
 * transformers' `num_labels`: saved as `id2label` (one entry per label), read from `num_labels`
 * when given that way, and 2 when neither is present (PretrainedConfig's default).
 */
function scoreLabels(cfg: HfConfig, where: string): number {
  const id2label = cfg.id2label;
  const n = id2label && typeof id2label === 'object' ? Object.keys(id2label).length : field<number>(cfg, 'num_labels', 'number', where, 2);
  if (!Number.isInteger(n) || n < 1) throw new ModelConfigError(`${where}: field 'num_labels' should be a positive integer, got ${n}`);
  return n;
}

/** Parses a config.json object; `where` names the file in errors. */
export function parseConfig(cfg: HfConfig, where = 'config.json'): DecoderConfig {
  const archs = cfg.architectures;
  const arch = Array.isArray(archs) ? (archs[0] as string) : undefined;
  if (!arch) throw new ModelConfigError(`${where}: missing field 'architectures'`);
  if (!ARCHITECTURES.includes(arch as Architecture)) {
    throw new ModelConfigError(`${where}: architecture '${arch}' is not supported (supported: ${ARCHITECTURES.join(', ')})`);
  }
  const n = (k: string, fallback?: number) => field<number>(cfg, k, 'number', where, fallback);
  const b = (k: string, fallback: boolean) => field<boolean>(cfg, k, 'boolean', where, fallback);
  const hiddenSize = n('hidden_size');
  const numHeads = n('num_attention_heads');
  const numKvHeads = n('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0) {
    throw new ModelConfigError(`${where}: num_attention_heads (${numHeads}) must be a multiple of num_key_value_heads (${numKvHeads})`);
  }
  const family = architectureFamily(arch as Architecture);
  // Qwen2 always biases q/k/v (never o); Llama and Qwen3 read attention_bias for all four.
  const qkvoBias = family === 'qwen2' ? false : b('attention_bias', false);
  return {
    architecture: arch as Architecture,
    vocabSize: n('vocab_size'),
    hiddenSize,
    intermediateSize: n('intermediate_size'),
    numLayers: n('num_hidden_layers'),
    numHeads,
    numKvHeads,
    headDim: n('head_dim', hiddenSize / numHeads),
    rmsNormEps: n('rms_norm_eps'),
    ropeTheta: typeof ropeParameters(cfg)?.rope_theta === 'number' ? (ropeParameters(cfg)!.rope_theta as number) : n('rope_theta', 10000),
    ropeScaling: ropeScaling(cfg, where),
    maxPositionEmbeddings: n('max_position_embeddings'),
    tieWordEmbeddings: b('tie_word_embeddings', false),
    attentionBias: family === 'qwen2' ? true : qkvoBias,
    outputBias: qkvoBias,
    mlpBias: family === 'llama' ? b('mlp_bias', false) : false,
    qkNorm: family === 'qwen3',
    ...(arch.endsWith('ForSequenceClassification') ? { scoreLabels: scoreLabels(cfg, where) } : {}),
    bosTokenId: typeof cfg.bos_token_id === 'number' ? cfg.bos_token_id : undefined,
    eosTokenId: typeof cfg.eos_token_id === 'number' || Array.isArray(cfg.eos_token_id) ? (cfg.eos_token_id as number | number[]) : undefined,
    padTokenId: typeof cfg.pad_token_id === 'number' ? cfg.pad_token_id : undefined,
    torchDtype: typeof cfg.torch_dtype === 'string' ? cfg.torch_dtype : typeof cfg.dtype === 'string' ? cfg.dtype : undefined,
  };
}

/**
 * The config.json each config was read from. Kept beside the config, not in it, so configs still
 * compare and serialise by their model fields alone; a copy (`{ ...config }`) loses it.
 */
const configFiles = new WeakMap<DecoderConfig, string>();

/** Reads and parses `<dir>/config.json`. */
export function readConfig(dir: string): { config: DecoderConfig; raw: HfConfig } {
  const path = join(dir, 'config.json');
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    throw new ModelConfigError(`${path}: not found (a Hugging Face model folder needs config.json)`);
  }
  let raw: HfConfig;
  try {
    raw = JSON.parse(text) as HfConfig;
  } catch (e) {
    throw new ModelConfigError(`${path}: invalid JSON (${(e as Error).message})`);
  }
  const config = parseConfig(raw, path);
  configFiles.set(config, path);
  return { config, raw };
}

/** The config.json `config` was read from by {@link readConfig}, when it was. */
export function configFile(config: DecoderConfig): string | undefined {
  return configFiles.get(config);
}

/**
 * Throws when a sequence of `length` positions does not fit the model: RoPE tables and the
 * model's training stop at `max_position_embeddings`. The error names `where` (the caller, e.g.
 * `prompt 3`), the config file when known and the field.
 */
export function checkSequenceLength(config: DecoderConfig, length: number, where: string): void {
  if (!Number.isInteger(length) || length < 0) throw new Error(`${where}: sequence length ${length} is not a non-negative integer`);
  if (length <= config.maxPositionEmbeddings) return;
  const file = configFile(config) ?? 'config.json';
  throw new ModelConfigError(`${where}: ${length} positions exceed max_position_embeddings = ${config.maxPositionEmbeddings} (${file})`);
}

/** A config.json object for a DecoderConfig (what transformers needs to load the model). */
export function toHfConfig(c: DecoderConfig, extra: HfConfig = {}): HfConfig {
  const family = architectureFamily(c.architecture);
  const rope: HfConfig | null =
    c.ropeScaling.type === 'default'
      ? null
      : c.ropeScaling.type === 'linear'
        ? { rope_type: 'linear', factor: c.ropeScaling.factor }
        : c.ropeScaling.type === 'llama3'
          ? {
              rope_type: 'llama3',
              factor: c.ropeScaling.factor,
              low_freq_factor: c.ropeScaling.lowFreqFactor,
              high_freq_factor: c.ropeScaling.highFreqFactor,
              original_max_position_embeddings: c.ropeScaling.originalMaxPositionEmbeddings,
            }
          : {
              rope_type: 'yarn',
              factor: c.ropeScaling.factor,
              original_max_position_embeddings: c.ropeScaling.originalMaxPositionEmbeddings,
              beta_fast: c.ropeScaling.betaFast,
              beta_slow: c.ropeScaling.betaSlow,
              ...(c.ropeScaling.attentionFactor !== undefined ? { attention_factor: c.ropeScaling.attentionFactor } : {}),
              ...(c.ropeScaling.truncate !== undefined ? { truncate: c.ropeScaling.truncate } : {}),
              ...(c.ropeScaling.mscale !== undefined ? { mscale: c.ropeScaling.mscale } : {}),
              ...(c.ropeScaling.mscaleAllDim !== undefined ? { mscale_all_dim: c.ropeScaling.mscaleAllDim } : {}),
            };
  return {
    architectures: [c.architecture],
    model_type: family,
    vocab_size: c.vocabSize,
    hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize,
    num_hidden_layers: c.numLayers,
    num_attention_heads: c.numHeads,
    num_key_value_heads: c.numKvHeads,
    head_dim: c.headDim,
    rms_norm_eps: c.rmsNormEps,
    // Both spellings: transformers 4 reads rope_theta/rope_scaling, 5 reads rope_parameters.
    rope_theta: c.ropeTheta,
    rope_scaling: rope,
    rope_parameters: { rope_theta: c.ropeTheta, ...(rope ?? { rope_type: 'default' }) },
    max_position_embeddings: c.maxPositionEmbeddings,
    tie_word_embeddings: c.tieWordEmbeddings,
    hidden_act: 'silu',
    ...(family === 'llama' ? { attention_bias: c.outputBias, mlp_bias: c.mlpBias } : {}),
    ...(family === 'qwen3' ? { attention_bias: c.outputBias } : {}),
    // transformers counts labels by id2label (num_labels is not a saved field).
    ...(c.scoreLabels !== undefined
      ? {
          id2label: Object.fromEntries([...Array(c.scoreLabels).keys()].map((i) => [String(i), `LABEL_${i}`])),
          label2id: Object.fromEntries([...Array(c.scoreLabels).keys()].map((i) => [`LABEL_${i}`, i])),
        }
      : {}),
    ...(c.bosTokenId !== undefined ? { bos_token_id: c.bosTokenId } : {}),
    ...(c.eosTokenId !== undefined ? { eos_token_id: c.eosTokenId } : {}),
    ...(c.padTokenId !== undefined ? { pad_token_id: c.padTokenId } : {}),
    torch_dtype: c.torchDtype ?? 'float32',
    ...extra,
  };
}
