/**
 * Decoder configuration read from a Hugging Face config.json (Qwen3ForCausalLM,
 * Qwen2ForCausalLM, LlamaForCausalLM). Unknown architectures and missing fields are errors that
 * name the file and field.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/** Architectures Lathe builds. */
export type Architecture = 'Qwen3ForCausalLM' | 'Qwen2ForCausalLM' | 'LlamaForCausalLM';
const ARCHITECTURES: Architecture[] = ['Qwen3ForCausalLM', 'Qwen2ForCausalLM', 'LlamaForCausalLM'];

/** RoPE frequency scaling (the variants these model families ship with). */
export type RopeScaling =
  | { type: 'default' }
  | { type: 'linear'; factor: number }
  | { type: 'llama3'; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number }
  | { type: 'yarn'; factor: number; originalMaxPositionEmbeddings: number; betaFast: number; betaSlow: number; attentionFactor?: number };

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
  /** Bias on q/k/v projections (Qwen2; Llama's `attention_bias`, which also biases o_proj). */
  attentionBias: boolean;
  /** Bias on o_proj (Llama's `attention_bias`). */
  outputBias: boolean;
  /** Bias on the MLP projections (Llama's `mlp_bias`). */
  mlpBias: boolean;
  /** Per-head RMSNorm of queries and keys before RoPE (Qwen3). */
  qkNorm: boolean;
  /** Token ids from config.json (may be absent). */
  bosTokenId?: number;
  eosTokenId?: number | number[];
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
      };
    default:
      throw new ModelConfigError(`${where}: rope_scaling type '${type}' is not supported (supported: default, linear, llama3, yarn)`);
  }
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
  const isLlama = arch === 'LlamaForCausalLM';
  const llamaBias = isLlama ? b('attention_bias', false) : false;
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
    attentionBias: arch === 'Qwen2ForCausalLM' ? true : llamaBias,
    outputBias: llamaBias,
    mlpBias: isLlama ? b('mlp_bias', false) : false,
    qkNorm: arch === 'Qwen3ForCausalLM',
    bosTokenId: typeof cfg.bos_token_id === 'number' ? cfg.bos_token_id : undefined,
    eosTokenId: typeof cfg.eos_token_id === 'number' || Array.isArray(cfg.eos_token_id) ? (cfg.eos_token_id as number | number[]) : undefined,
    torchDtype: typeof cfg.torch_dtype === 'string' ? cfg.torch_dtype : typeof cfg.dtype === 'string' ? cfg.dtype : undefined,
  };
}

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
  return { config: parseConfig(raw, path), raw };
}

/** A config.json object for a DecoderConfig (what transformers needs to load the model). */
export function toHfConfig(c: DecoderConfig, extra: HfConfig = {}): HfConfig {
  const modelType = { Qwen3ForCausalLM: 'qwen3', Qwen2ForCausalLM: 'qwen2', LlamaForCausalLM: 'llama' }[c.architecture];
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
            };
  return {
    architectures: [c.architecture],
    model_type: modelType,
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
    ...(c.architecture === 'LlamaForCausalLM' ? { attention_bias: c.outputBias, mlp_bias: c.mlpBias } : {}),
    ...(c.architecture === 'Qwen3ForCausalLM' ? { attention_bias: false } : {}),
    ...(c.bosTokenId !== undefined ? { bos_token_id: c.bosTokenId } : {}),
    ...(c.eosTokenId !== undefined ? { eos_token_id: c.eosTokenId } : {}),
    torch_dtype: c.torchDtype ?? 'float32',
    ...extra,
  };
}
