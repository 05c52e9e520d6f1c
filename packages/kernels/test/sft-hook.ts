/**
 * Shared by the kernels' ops tests: the largest relative difference of two arrays, and a tiny Qwen3's
 * SFT loss and weight gradients on the CPU (flash-attention path) built with a kernel hook of
 * `sftLoss` and without it, so a test compares the two.
 */
import * as L from '@lathe/onnx';
import { paramSpecs } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { sftLoss } from '@lathe/train';
import { tinyModel, tinyQwen3, weightFeeds } from '../../models/test/tiny';

/** max |a − b| / max |b|, and max |b|. */
export function maxRel(a: ArrayLike<number>, b: ArrayLike<number>): { err: number; scale: number } {
  let err = 0;
  let scale = 0;
  for (let i = 0; i < a.length; i++) {
    err = Math.max(err, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return { err: err / scale, scale };
}

/** Custom ops a hook needs in the session: their domain, the rethrow of a compute's error, and disposal. */
export interface HookOps {
  domain: { handle: bigint };
  check(): void;
  dispose(): void;
}

/** The kernel options of `sftLoss` a test sets, with the ops whose domains the session needs. */
export interface SftHooks {
  options: Omit<NonNullable<Parameters<typeof sftLoss>[1]>, 'chunk' | 'flashAttention' | 'recompute' | 'shape'>;
  ops: HookOps[];
}

/**
 * A tiny Qwen3 (3 layers)'s SFT loss and its gradients with respect to every weight, on two ragged rows
 * of 6 tokens, with `hooks()` (made fresh per call; its ops disposed after); `inspect` sees the graph
 * before it compiles (node counts). Outputs by name: `loss` and `d/<weight>`.
 */
export function sftLossWith(hooks: () => SftHooks, opts: { recompute?: boolean; inspect?: (g: L.Graph) => void } = {}): Map<string, Float32Array> {
  const { dir, config } = tinyModel(tinyQwen3, 3);
  const B = 2;
  const T = 6;
  const names = paramSpecs(config).map((s) => s.name);
  const feeds = {
    ...weightFeeds(dir, config, 'float32'),
    input_ids: { data: BigInt64Array.from([3, 14, 15, 9, 2, 6, 7, 1, 8, 0, 0, 0].map(BigInt)), dims: [B, T] },
    attention_mask: { data: BigInt64Array.from([1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0].map(BigInt)), dims: [B, T] },
    loss_mask: { data: BigInt64Array.from([0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0].map(BigInt)), dims: [B, T] },
    loss_tokens: { data: Float32Array.of(7), dims: [] },
  };
  const outs = ['loss', ...names.map((n) => `d/${n}`)];
  const { options, ops } = hooks();
  try {
    const g = new L.Graph('sft_hook');
    const params = new Map(paramSpecs(config).map((s) => [s.name, g.input(s.name, 'float32', s.shape)] as const));
    const { loss } = sftLoss(config, { chunk: 16, flashAttention: true, recompute: opts.recompute ?? false, shape: [B, T], ...options })(g, params);
    g.output(loss, 'loss');
    L.grad(loss, names.map((n) => params.get(n)!)).forEach((d, i) => g.output(d!, `d/${names[i]}`));
    opts.inspect?.(g);
    const session = Device.cpu().compile(g, { customOpDomains: ops.map((o) => o.domain.handle) });
    const bind = session.binding();
    try {
      for (const [name, t] of Object.entries(feeds)) if (g.inputs.some((i) => i.name === name)) bind.input(name, t);
      for (const n of outs) bind.output(n, 'host');
      bind.runSync();
      for (const o of ops) o.check();
      return new Map(outs.map((n) => [n, Float32Array.from(bind.fetch(n).data as Float32Array)] as const));
    } finally {
      bind.dispose();
      session.dispose();
    }
  } finally {
    for (const o of ops) o.dispose();
  }
}

/** Every output of `got` within `tol` (relative to the largest value) of `want`'s, and none all zero. */
export function expectSameOutputs(got: Map<string, Float32Array>, want: Map<string, Float32Array>, tol = 1e-5): void {
  for (const [n, w] of want) {
    const { err, scale } = maxRel(got.get(n)!, w);
    expect([n, scale > 0, err < tol]).toEqual([n, true, true]);
  }
}
