/** The parameters of a decoder: Hugging Face names, shapes, and what kind of tensor each is. */
import type { DecoderConfig } from './config';

/** One parameter of the model. */
export interface ParamSpec {
  /** Hugging Face parameter name, e.g. `model.layers.0.self_attn.q_proj.weight`. */
  name: string;
  shape: number[];
  /** Norm weights and biases get no weight decay; embeddings and matrices do. */
  kind: 'embedding' | 'matrix' | 'norm' | 'bias';
}

/** The `score` head's weight name of a sequence classifier (reward model): [scoreLabels, hidden]. */
export const SCORE_WEIGHT = 'score.weight';

/** Every parameter of the decoder + LM head (or score head), in a stable order. */
export function paramSpecs(c: DecoderConfig): ParamSpec[] {
  const D = c.hiddenSize;
  const qDim = c.numHeads * c.headDim;
  const kvDim = c.numKvHeads * c.headDim;
  const specs: ParamSpec[] = [{ name: 'model.embed_tokens.weight', shape: [c.vocabSize, D], kind: 'embedding' }];
  for (let i = 0; i < c.numLayers; i++) {
    const p = `model.layers.${i}`;
    const a = `${p}.self_attn`;
    specs.push({ name: `${p}.input_layernorm.weight`, shape: [D], kind: 'norm' });
    specs.push({ name: `${a}.q_proj.weight`, shape: [qDim, D], kind: 'matrix' });
    specs.push({ name: `${a}.k_proj.weight`, shape: [kvDim, D], kind: 'matrix' });
    specs.push({ name: `${a}.v_proj.weight`, shape: [kvDim, D], kind: 'matrix' });
    if (c.attentionBias) {
      specs.push({ name: `${a}.q_proj.bias`, shape: [qDim], kind: 'bias' });
      specs.push({ name: `${a}.k_proj.bias`, shape: [kvDim], kind: 'bias' });
      specs.push({ name: `${a}.v_proj.bias`, shape: [kvDim], kind: 'bias' });
    }
    specs.push({ name: `${a}.o_proj.weight`, shape: [D, qDim], kind: 'matrix' });
    if (c.outputBias) specs.push({ name: `${a}.o_proj.bias`, shape: [D], kind: 'bias' });
    if (c.qkNorm) {
      specs.push({ name: `${a}.q_norm.weight`, shape: [c.headDim], kind: 'norm' });
      specs.push({ name: `${a}.k_norm.weight`, shape: [c.headDim], kind: 'norm' });
    }
    specs.push({ name: `${p}.post_attention_layernorm.weight`, shape: [D], kind: 'norm' });
    for (const proj of ['gate_proj', 'up_proj'] as const) {
      specs.push({ name: `${p}.mlp.${proj}.weight`, shape: [c.intermediateSize, D], kind: 'matrix' });
      if (c.mlpBias) specs.push({ name: `${p}.mlp.${proj}.bias`, shape: [c.intermediateSize], kind: 'bias' });
    }
    specs.push({ name: `${p}.mlp.down_proj.weight`, shape: [D, c.intermediateSize], kind: 'matrix' });
    if (c.mlpBias) specs.push({ name: `${p}.mlp.down_proj.bias`, shape: [D], kind: 'bias' });
  }
  specs.push({ name: 'model.norm.weight', shape: [D], kind: 'norm' });
  // A sequence classifier (reward model) has transformers' `score` Linear, without bias, and no LM head.
  if (c.scoreLabels !== undefined) specs.push({ name: SCORE_WEIGHT, shape: [c.scoreLabels, D], kind: 'matrix' });
  else if (!c.tieWordEmbeddings) specs.push({ name: 'lm_head.weight', shape: [c.vocabSize, D], kind: 'matrix' });
  return specs;
}

/** Total number of parameters. */
export function paramCount(c: DecoderConfig): number {
  return paramSpecs(c).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);
}

/** The LM head's weight name (the embedding when tied); a sequence classifier has none. */
export function lmHeadName(c: DecoderConfig): string {
  if (c.scoreLabels !== undefined) {
    throw new Error(`${c.architecture} has a 'score' head (${c.scoreLabels} outputs) and no LM head: read it with valueAtLastToken or valuePerToken`);
  }
  return c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
}
