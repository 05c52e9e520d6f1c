/**
 * Dropout masks computed inside the graph from a counter-based integer hash: a mask is a pure
 * function of a small key (fed as an int64 input each run) and each element's position, so a
 * resumed run redraws exactly the masks the uninterrupted run drew, and nothing but the key crosses
 * the host boundary.
 *
 * Why not RandomUniformLike: ONNX Runtime keeps its generator in the session, so the stream
 * restarts whenever a session is created (every resume) and advances with every run; its masks
 * cannot be reproduced.
 *
 * The hash is the permutation of [0, P) by quadratic residues from Jeff Preshing's "How to Generate
 * a Sequence of Unique Random Integers" (2012), P = 2^31 − 1 (prime, ≡ 3 mod 4):
 *   Q(x) = x² mod P for x ≤ P/2, else P − (x² mod P)
 * (x < 2^31, so x² < 2^62 is exact in int64), built only from ops ONNX Runtime's CUDA provider
 * implements for int64 — Mul, Mod (fmod = 0), Add, Sub, Less, Where — and no Bitwise*\/BitShift op
 * (their CUDA kernels are unverified here). Squaring makes it non-linear: Q(v + d) − Q(v) =
 * 2vd + d² (mod P) varies with v, so masks under keys that differ by any amount, even 1, are
 * independent. A murmur-style finalizer with its xors made adds fails exactly there (it stays
 * nearly linear: masks under keys k and k + 1 correlated at 0.1–0.25 when tried); Preshing's
 * construction has an xor between its two rounds, which an add replaces here.
 *
 * A mask: u = Q((Q(position) + c) mod P) for each element (its row-major index in the tensor,
 * below P), computed once per tensor however many masks cover it; then per mask h = Q((u + k) mod P)
 * with k a stream key ({@link streamKey}: the input key's parts chained through Q, salted per user,
 * e.g. per LoRA adapter); an element is dropped where h < p·P. Q being a permutation keeps h
 * uniform, and hashing the position before adding the key keeps one key's mask from being a
 * shifted copy of another's. Quality is tested (keep rate, independence across keys and between
 * neighbouring elements: test/lora.test.ts), not proved.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';

/** The prime modulus: 2^31 − 1. */
const P = 2147483647;

/** Q(x) for int64 x in [0, P): Preshing's quadratic-residue permutation (see the file's comment). */
export function permuteQpr(x: Tensor): Tensor {
  if (x.dtype !== 'int64') throw new Error(`permuteQpr: expects int64, got ${x.dtype}`);
  const r = L.mod(L.mul(x, x), P);
  return L.where(L.less(x, Math.floor(P / 2) + 1), r, L.sub(P, r));
}

/** Q((x + y) mod P): a key or position added, then permuted. */
function addPermute(x: Tensor, y: Tensor | number): Tensor {
  return permuteQpr(L.mod(L.add(x, y), P));
}

/**
 * A stream key (int64 scalar in [0, P)) from an int64 key vector [n] (e.g. seed, optimizer step,
 * micro-batch) and a salt (e.g. an adapter's index): the parts, taken mod P, chained through Q one
 * after another, so every part changes the result.
 */
export function streamKey(key: Tensor, salt: number): Tensor {
  const n = key.shape[0];
  if (key.dtype !== 'int64' || key.rank !== 1 || typeof n !== 'number') throw new Error(`streamKey: expects an int64 vector of static length, got ${key}`);
  const part = (i: number) => L.mod(L.reshape(L.slice(key, [0], [i], [i + 1]), []), P);
  let k = addPermute(part(0), 0x5bf03635);
  for (let i = 1; i < n; i++) k = addPermute(k, part(i));
  return addPermute(k, salt % P);
}

/**
 * Each element's row-major index in `x` (int64, x's shape), built from cumulative sums over x's
 * values rather than from its run-time shape (shape arithmetic would run on the CPU). The last
 * dim must be static.
 */
export function elementIndex(x: Tensor): Tensor {
  const last = x.shape[x.rank - 1];
  if (typeof last !== 'number') throw new Error(`elementIndex: the last dim of ${x} must be static`);
  const columns = x.graph.constant(Array.from({ length: last }, (_, i) => i), 'int64', [last]);
  if (x.rank === 1) return columns;
  // ones [d0, …, d_{r−2}, 1] from x's first column: cast, ×0, +1 (no Shape: no shape arithmetic; no bf16 Expand)
  const ones = L.add(L.mul(L.cast(L.slice(x, [x.rank - 1], [0], [1]), 'int64'), 0), 1);
  let row: Tensor | undefined;
  for (let ax = 0; ax < x.rank - 1; ax++) {
    const at = L.cumsum(ones, ax, { exclusive: true });
    const size = L.slice(L.cumsum(ones, ax), [ax], [-1]); // the axis's length, broadcastable
    row = row ? L.add(L.mul(row, size), at) : at;
  }
  return L.add(L.mul(row!, last), columns);
}

const positionHashes = new WeakMap<Tensor, Tensor>();

/** Q((Q(position) + c) mod P) of each element of `x`, made once per tensor (several masks over one input share it). */
function positionHash(x: Tensor): Tensor {
  let u = positionHashes.get(x);
  if (!u) positionHashes.set(x, (u = addPermute(permuteQpr(elementIndex(x)), 0x2545f491)));
  return u;
}

/**
 * Dropout's mask over `x`: bool, true where an element is dropped, with probability `p`, as a
 * function of the stream key ({@link streamKey}) and the element's position only (x must have
 * fewer than 2^31 − 1 elements).
 */
export function droppedElements(x: Tensor, stream: Tensor, p: number): Tensor {
  if (!(p >= 0 && p < 1)) throw new Error(`droppedElements: p must be in [0, 1), got ${p}`);
  return L.less(addPermute(positionHash(x), stream), Math.round(p * P));
}
