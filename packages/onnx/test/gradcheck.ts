/**
 * Gradient checking against central finite differences. A case builds y = f(inputs); the checked
 * scalar is L = Σ y ⊙ W for a fixed random W, so every output element is weighted differently.
 */
import { Graph, grad, reduceSum, mul, type Tensor, type DType } from '@lathe/onnx';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

/** How a test input is filled. */
export type Fill = 'normal' | 'positive' | 'distinct' | { ints: number[] } | { values: number[] } | { bool: number[] };

/** One input of a case. */
export interface CaseInput {
  shape: number[];
  fill?: Fill;
  /** Integer/bool inputs (indices, masks) are never differentiated. */
  dtype?: DType;
}

/** A gradient-check case. */
export interface GradCase {
  name: string;
  inputs: CaseInput[];
  build: (xs: Tensor[]) => Tensor;
  /** float64 by default; float32 where ORT's CPU provider has no float64 kernel. */
  dtype?: 'float64' | 'float32';
}

/** Result of one check. */
export interface GradCheckResult {
  /** Op types of the forward graph (what this case covers). */
  ops: Set<string>;
  /** Largest |analytic − numeric| / (atol + rtol·|numeric|); ≤ 1 passes. */
  worst: number;
  detail: string;
}

function fillValues(n: number, fill: Fill, r: () => number): number[] {
  if (typeof fill === 'object') {
    const v = 'ints' in fill ? fill.ints : 'values' in fill ? fill.values : fill.bool;
    if (v.length !== n) throw new Error(`fill has ${v.length} values for ${n} elements`);
    return v;
  }
  switch (fill) {
    case 'normal':
      return Array.from({ length: n }, () => r() * 2 - 1);
    case 'positive':
      return Array.from({ length: n }, () => 0.5 + r());
    case 'distinct': {
      // Well-separated values so max/min/topk are not near ties within a finite-difference step.
      const perm = Array.from({ length: n }, (_, i) => i).sort(() => r() - 0.5);
      return perm.map((p) => (p - n / 2) * 0.37 + 0.01 * r());
    }
  }
}

function host(values: number[], dtype: DType, dims: number[]): HostTensor {
  switch (dtype) {
    case 'float64':
      return { data: Float64Array.from(values), dims };
    case 'float32':
      return { data: Float32Array.from(values), dims };
    case 'int64':
      return { data: BigInt64Array.from(values.map((v) => BigInt(v))), dims };
    case 'int32':
      return { data: Int32Array.from(values), dims };
    case 'bool':
      return { data: Uint8Array.from(values), dims };
    default:
      throw new Error(`unsupported test dtype ${dtype}`);
  }
}

/** Builds the case, runs analytic and numeric gradients, and compares them. */
export async function gradCheck(c: GradCase, seed = 1): Promise<GradCheckResult> {
  const fdt = c.dtype ?? 'float64';
  const r = rng(seed);
  const g = new Graph(c.name.replace(/\W+/g, '_'));
  const xs = c.inputs.map((inp, i) => g.input(`x${i}`, inp.dtype ?? fdt, inp.shape));
  const y = c.build(xs);
  const ops = new Set(g.nodes.map((n) => n.op.name));
  const yShape = y.shape.map((d) => {
    if (typeof d !== 'number') throw new Error(`${c.name}: output dim ${d} is not static`);
    return d;
  });
  const yCount = yShape.reduce((a, b) => a * b, 1);
  const w = g.constant(Array.from({ length: yCount }, () => r() * 2 - 1), y.dtype, yShape);
  const loss = reduceSum(mul(y, w));
  const diff = xs.filter((x, i) => (c.inputs[i].dtype ?? fdt) === fdt);
  const grads = grad(loss, diff);
  g.output(loss, 'loss');
  g.output(y, 'y');
  grads.forEach((gr, i) => g.output(gr, `grad${i}`));
  const run = await compile(g);

  const values = c.inputs.map((inp) => fillValues(inp.shape.reduce((a, b) => a * b, 1), inp.fill ?? 'normal', r));
  const feeds = (vals: number[][]) => Object.fromEntries(c.inputs.map((inp, i) => [`x${i}`, host(vals[i], inp.dtype ?? fdt, inp.shape)]));
  const base = await run(feeds(values));
  // The shape inferred at build time must be the shape ORT computes.
  if (base.y.dims.join(',') !== yShape.join(',')) {
    throw new Error(`${c.name}: inferred shape [${yShape}] but ORT produced [${base.y.dims}]`);
  }

  const h = fdt === 'float64' ? 1e-6 : 1e-3;
  const atol = fdt === 'float64' ? 1e-7 : 2e-3;
  const rtol = fdt === 'float64' ? 1e-5 : 2e-2;
  let worst = 0;
  let detail = '';
  let k = 0;
  for (let i = 0; i < c.inputs.length; i++) {
    if ((c.inputs[i].dtype ?? fdt) !== fdt) continue;
    const analytic = base[`grad${k++}`].data as Float64Array;
    for (let j = 0; j < values[i].length; j++) {
      const plus = values.map((v) => [...v]);
      const minus = values.map((v) => [...v]);
      plus[i][j] += h;
      minus[i][j] -= h;
      const lp = Number((await run(feeds(plus))).loss.data[0]);
      const lm = Number((await run(feeds(minus))).loss.data[0]);
      const numeric = (lp - lm) / (2 * h);
      const err = Math.abs(analytic[j] - numeric) / (atol + rtol * Math.abs(numeric));
      if (!(err <= worst)) {
        worst = Number.isNaN(err) ? Infinity : err;
        detail = `input ${i} element ${j}: analytic ${analytic[j]}, numeric ${numeric}`;
      }
    }
  }
  return { ops, worst, detail };
}
