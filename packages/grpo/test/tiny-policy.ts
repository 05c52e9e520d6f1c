/**
 * Test helper: a tiny autoregressive policy with a known optimum. Token t's logits are
 * `prev[ids[t]] + prompt[ids[0]]` (two V×V tables: one keyed by the previous token, one by the
 * prompt token at column 0), so any response can be learned for any prompt.
 */
import * as L from '@lathe/onnx';
import type { TrainableParam } from '@lathe/train';
import { stateNames } from '@lathe/train';
import { shiftLeft } from '@lathe/models';
import type { PolicyBuilder } from '@lathe/grpo';
import type { HostTensor } from '../../../tools/testing/ort-cpu';

/** The policy's trainable tables. */
export function tinyParams(V: number): TrainableParam[] {
  return [
    { name: 'prev', shape: [V, V], decay: false },
    { name: 'prompt', shape: [V, V], decay: false },
  ];
}

/** log π and entropy of the tabular policy; input `input_ids` int64 [B, T]. */
export const tinyPolicy: PolicyBuilder = (g, params) => {
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const logits = L.add(L.gather(params.get('prev')!, ids, 0), L.gather(params.get('prompt')!, L.slice(ids, [1], [0], [1]), 0)); // [B, T, V]
  return { logp: L.tokenLogprobs(logits, shiftLeft(ids)), entropy: L.entropy(logits) };
};

/** Initial parameters (small random values, seeded) and zero AdamW moments. */
export function tinyState(V: number, rand: () => number): Record<string, HostTensor> {
  const state: Record<string, HostTensor> = {};
  for (const p of tinyParams(V)) {
    const n = V * V;
    state[p.name] = { data: Float32Array.from({ length: n }, () => (rand() - 0.5) * 0.02), dims: p.shape };
    state[stateNames.m(p.name)] = { data: new Float32Array(n), dims: p.shape };
    state[stateNames.v(p.name)] = { data: new Float32Array(n), dims: p.shape };
  }
  return state;
}

/** The policy's next-token probabilities on the host (float64), from the current tables. */
export function tinyProbs(state: Record<string, HostTensor>, V: number, prev: number, prompt: number): number[] {
  const a = state.prev.data as Float32Array;
  const b = state.prompt.data as Float32Array;
  const logits = Array.from({ length: V }, (_, v) => a[prev * V + v] + b[prompt * V + v]);
  const m = Math.max(...logits);
  const e = logits.map((l) => Math.exp(l - m));
  const z = e.reduce((x, y) => x + y, 0);
  return e.map((x) => x / z);
}

/** Replaces parameters and moments with a step's `next/…` outputs. */
export function nextState(state: Record<string, HostTensor>, out: Record<string, HostTensor>): Record<string, HostTensor> {
  const s = { ...state };
  for (const [k, v] of Object.entries(out)) if (k.startsWith('next/')) s[k.slice(5)] = v;
  return s;
}
