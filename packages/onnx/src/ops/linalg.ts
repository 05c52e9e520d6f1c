/** Batched matrix multiplication with NumPy broadcasting of the batch dims. */
import { broadcastShapes, dimEquals, formatShape, isAnonymousDim } from '../dim';
import { applyOp, type Tensor } from '../graph';
import { defineOp } from '../op';
import { unbroadcast } from './core';
import { reshape, transpose } from './shape-ops';

export const matMulOp = defineOp({
  name: 'MatMul',
  infer: ([a, b]) => {
    if (a!.dtype !== b!.dtype) throw new Error(`dtypes differ (${a!.dtype} vs ${b!.dtype}); cast explicitly`);
    if (a!.shape.length < 2 || b!.shape.length < 2) throw new Error('operands need rank ≥ 2 (unsqueeze vectors first)');
    const [m, k1] = a!.shape.slice(-2);
    const [k2, n] = b!.shape.slice(-2);
    if (!dimEquals(k1, k2) && !isAnonymousDim(k1) && !isAnonymousDim(k2)) {
      throw new Error(`inner dims differ: ${formatShape(a!.shape)} @ ${formatShape(b!.shape)}`);
    }
    const batch = broadcastShapes(a!.shape.slice(0, -2), b!.shape.slice(0, -2));
    if (!batch) throw new Error(`batch dims do not broadcast: ${formatShape(a!.shape)} @ ${formatShape(b!.shape)}`);
    return [{ dtype: a!.dtype, shape: [...batch, m, n] }];
  },
  // dA = g·Bᵀ, dB = Aᵀ·g, each summed over batch dims the operand was broadcast along.
  grad: ({ inputs: [a, b], dy: [g] }) => [
    unbroadcast(matmul(g!, swapLast(b!)), a!.shape),
    b!.rank === 2 && a!.rank > 2 && b!.shape.every((d) => typeof d === 'number') ? weightGrad(a!, g!) : unbroadcast(matmul(swapLast(a!), g!), b!.shape),
  ],
});

/**
 * dB of x [..., M, K] @ B [K, N] (a Linear's weight, broadcast over x's batch dims): one GEMM over
 * all rows, [K, rows]·[rows, N], instead of a batched product [..., K, N] summed over the batch —
 * which would materialise a weight-sized value per batch entry, run one small GEMM per entry, and
 * sum the partial products in the compute dtype (the GEMM accumulates in float32).
 */
function weightGrad(x: Tensor, g: Tensor): Tensor {
  const k = x.shape[x.rank - 1];
  const n = g.shape[g.rank - 1];
  return matmul(transpose(reshape(x, [-1, k]), [1, 0]), reshape(g, [-1, n]));
}

function swapLast(x: Tensor): Tensor {
  const perm = [...Array(x.rank).keys()];
  [perm[x.rank - 2], perm[x.rank - 1]] = [perm[x.rank - 1], perm[x.rank - 2]];
  return transpose(x, perm);
}

/** a @ b over the last two axes, broadcasting batch axes. */
export function matmul(a: Tensor, b: Tensor): Tensor {
  return applyOp(matMulOp, [a, b], {})[0];
}
