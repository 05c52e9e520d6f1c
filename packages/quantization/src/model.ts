/**
 * The model-level pass: a decoder's chosen linear layers quantized (default: every decoder
 * projection; embeddings, norms and the LM head stay dense), the graphs' weights with those layers
 * read through their kernels, and what it saved in bits per parameter.
 *
 *   const q = QuantizedModel.quantize(model.config, model.float32Weights(), { format: 'nf4', doubleQuant: true });
 *   const gen = KvCacheGenerator.create(device, q.config, undefined, { rows, maxLength, dtype, graphWeights: (g) => q.graphWeights(g, { dtype }).weights });
 *   gen.bindWeights(q.deviceTensors(device, dtype));
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { CausalLM, isProjectionWeight, lmHeadName, paramSpecs, type CausalLMOptions, type DecoderConfig, type Weights } from '@lathe/models';
import { toBfloat16Bits, toFloat16Bits, type Device, type DeviceKind, type DeviceTensor, type SessionOptions } from '@lathe/runtime';
import { fusedGemmIneligibility, fusedGemmSession } from './fused';
import { takesKernel, type NBitsKernel, type NBitsPipeline, type NBitsPipelineProjection } from './kernel';
import { declareQuantizedLinear, kernelTensorSpecs, quantizedMatmul, type QuantizedLinearDeclaration, type QuantizedLinearTensors, type QuantizedMatmulMode } from './linear';
import { kernelLayout, type Bnb4Layout, type NBitsLayout } from './layout';
import { dequantize, kBlocks, QUANT_FORMATS, storedBytes, type QuantFormat, type QuantizedMatrix } from './matrix';
import { INT4_BLOCK_SIZES, quantizeInt4, quantizeInt8, quantizeNf4 } from './quantize';

/** How a model is quantized. */
export interface QuantScheme {
  format: QuantFormat;
  /** INT4: 32, 64 or 128 (default 64); NF4: 64. INT8 is per output channel. */
  blockSize?: number;
  /** INT4 with per-block zero points (asymmetric). */
  zeroPoints?: boolean;
  /** NF4: quantize the block scales too (8-bit, blocks of 256). */
  doubleQuant?: boolean;
}

/** Options of {@link QuantizedModel.quantize}. */
export interface QuantizeOptions extends QuantScheme {
  /** Which weights to quantize, by HF name (default: the decoder projections q/k/v/o, gate/up/down). */
  include?: (hfName: string) => boolean;
  /** Called after each layer is quantized. */
  onProgress?: (done: number, total: number, hfName: string) => void;
  /**
   * Also quantize the LM head in this scheme, as an extra copy read by `lmLogits` (generation's
   * logits); the dense head (the embedding, when tied) stays for the embedding lookup and scoring.
   */
  lmHead?: QuantScheme;
}

/** What quantizing saved. */
export interface QuantizationReport {
  format: QuantFormat;
  /** Quantized weights. */
  layers: number;
  quantizedParams: number;
  totalParams: number;
  /** Stored bits per weight of the quantized layers (codes, scales, zero points, nested state). */
  bitsPerQuantizedWeight: number;
  /** Stored bits per parameter of the whole model, dense parameters counted at `denseBits`. */
  bitsPerParameter: number;
  /** The dense parameters' bits (16 for bf16 checkpoints). */
  denseBits: number;
  /** Layers whose K is not a multiple of the block size, padded with zero weights in the kernel layout. */
  padded: string[];
  /** The quantized LM head's format and bytes, when there is one (an extra copy: not in the bits per parameter). */
  lmHead?: { format: QuantFormat; bytes: number };
}

/** A decoder with some linear layers quantized: dense float32 parameters plus quantized matrices, by HF name. */
export class QuantizedModel {
  private constructor(
    readonly config: DecoderConfig,
    readonly scheme: QuantScheme,
    /** The parameters left dense, float32. */
    readonly dense: ReadonlyMap<string, Float32Array>,
    /** The quantized weights. */
    readonly layers: ReadonlyMap<string, QuantizedMatrix>,
    /** A quantized copy of the LM head (see {@link QuantizeOptions.lmHead}), with its scheme. */
    readonly lmHead?: { name: string; scheme: QuantScheme; matrix: QuantizedMatrix },
  ) {}

  /** Quantizes `weights` (every parameter of `config`, float32 by HF name: e.g. `CausalLM.float32Weights()`). */
  static quantize(config: DecoderConfig, weights: ReadonlyMap<string, Float32Array>, opts: QuantizeOptions): QuantizedModel {
    checkScheme(opts);
    const include = opts.include ?? isProjectionWeight;
    const specs = paramSpecs(config);
    const chosen = specs.filter((s) => s.shape.length === 2 && include(s.name));
    const dense = new Map<string, Float32Array>();
    const layers = new Map<string, QuantizedMatrix>();
    for (const spec of specs) {
      const w = weights.get(spec.name);
      if (!w) throw new Error(`QuantizedModel.quantize: missing weight '${spec.name}'`);
      if (!chosen.includes(spec)) dense.set(spec.name, w);
    }
    chosen.forEach((spec, i) => {
      const [N, K] = spec.shape;
      layers.set(spec.name, quantizeMatrix(weights.get(spec.name)!, N, K, opts));
      opts.onProgress?.(i + 1, chosen.length, spec.name);
    });
    return new QuantizedModel(config, schemeOf(opts), dense, layers, opts.lmHead ? quantizedHead(config, dense, opts.lmHead) : undefined);
  }

  /** A model from its parts (a checkpoint reader's): every parameter either dense or quantized. */
  static fromParts(config: DecoderConfig, scheme: QuantScheme, dense: ReadonlyMap<string, Float32Array>, layers: ReadonlyMap<string, QuantizedMatrix>, lmHead?: QuantScheme): QuantizedModel {
    for (const spec of paramSpecs(config)) {
      const q = layers.get(spec.name);
      if (q) {
        if (q.rows !== spec.shape[0] || q.cols !== spec.shape[1]) throw new Error(`quantized '${spec.name}' is [${q.rows}, ${q.cols}], the config implies [${spec.shape}]`);
      } else if (!dense.has(spec.name)) throw new Error(`missing weight '${spec.name}' (neither dense nor quantized)`);
    }
    return new QuantizedModel(config, scheme, dense, layers, lmHead ? quantizedHead(config, dense, lmHead) : undefined);
  }

  /** Every parameter as float32 (quantized layers dequantized), in paramSpecs order. */
  dequantizedWeights(): Map<string, Float32Array> {
    return new Map(paramSpecs(this.config).map((s) => [s.name, this.dense.get(s.name) ?? dequantize(this.layers.get(s.name)!)] as const));
  }

  /** The dequantized model as a `CausalLM`, for any consumer that takes one (same values as the quantized graphs, dense storage). */
  toCausalLM(opts: CausalLMOptions = {}): CausalLM {
    return CausalLM.fromWeights(this.config, this.dequantizedWeights(), opts);
  }

  /**
   * The weights of a graph: dense parameters as graph inputs by HF name in `dtype`, quantized
   * layers as their kernel tensors (inputs named `<weight>.q`, `.scales`, `.zero_points`,
   * `.absmax`), read by `project` through the `matmul` hook. Bind {@link deviceTensors}. Graph
   * names start with `prefix` (two models in one graph). `backward`: how gradients flow through
   * NF4 layers (LoRA over the frozen base): MatMulBnb4 with transB = 0 ('kernel', CUDA) or through
   * the dequantized weights ('dequantize', default, any provider). `skip`: dense parameters not to
   * declare (a trained score head the caller supplies).
   * `mode: 'dequantize'` dequantizes in the graph instead (standard ops, for providers without the kernels).
   * `quantizedWeights: 'initializers'`: the kernel tensors are initializers holding the bytes
   * (scales in `dtype`) instead of inputs, so ONNX Runtime prepacks them — frozen weights for
   * generation (see {@link generation}); bind `deviceTensors(…, { quantizedWeights: 'initializers' })`.
   * `quantizedWeights: 'kernel'`: the kernel tensors are bound inputs as by default, and each INT4
   * projection whose rows are known and at most `kernelMaxRows` (default 64: decode steps) runs
   * through `kernel` (Lathe's W4A16 op: `w4a16Ops` of @lathe/kernels) instead of MatMulNBits;
   * projections that share their input (q/k/v, gate/up: {@link FUSED_PROJECTIONS}) are held
   * concatenated along N (inputs named after the fused weight, e.g. `….qkv_proj.weight.q`) and run as
   * one node — the op writing each projection's output, or MatMulNBits and slices where the op does not apply.
   * `pipeline` (with `quantizedWeights: 'kernel'`): the INT4 projections the kernel does not take (more rows
   * than `kernelMaxRows`, or rows unknown at build: prefill) go through it — Lathe's dequantize + cuBLAS, one
   * GEMM a fused group, `weights.packed` handing a group over as one tensor (`w4a16GemmOps` of @lathe/kernels;
   * with slots, in the order the model reads them) — instead of MatMulNBits.
   */
  graphWeights(
    g: Graph,
    opts: { dtype: DType; mode?: QuantizedMatmulMode; inline?: boolean; prefix?: string; backward?: 'kernel' | 'dequantize'; skip?: readonly string[]; quantizedWeights?: QuantizedWeightsAs; kernel?: NBitsKernel; kernelMaxRows?: number; pipeline?: NBitsPipeline },
  ): { weights: Weights; inputs: Map<string, Tensor> } {
    const p = opts.prefix ?? '';
    const own = opts.quantizedWeights === 'kernel' ? opts.kernel : undefined;
    if (opts.quantizedWeights === 'kernel' && !own) throw new Error(`graphWeights: quantizedWeights 'kernel' needs the kernel (w4a16Ops of @lathe/kernels) as opts.kernel`);
    const inputs = new Map<string, Tensor>();
    const kernels = new Map<string, QuantizedLinearTensors>();
    const how: QuantizedLinearDeclaration = opts.inline ? { inline: true } : { scaleDtype: opts.dtype, initializer: opts.quantizedWeights === 'initializers' };
    // 'kernel': projections sharing an input as one concatenated weight; member → (group tensors, output index)
    const grouped = new Map<string, { group: FusedProjection; t: QuantizedLinearTensors; index: number }>();
    if (own) {
      for (const group of this.fusedProjections()) {
        if (group.members.some((m) => opts.skip?.includes(m))) continue;
        const t = declareQuantizedLinear(g, p + group.name, group.layout, how);
        for (const x of [t.b, 'scales' in t ? t.scales : undefined, 'zeroPoints' in t ? t.zeroPoints : undefined]) if (x) inputs.set(x.name, x);
        group.members.forEach((m, index) => grouped.set(m, { group, t, index }));
      }
    }
    for (const spec of paramSpecs(this.config)) {
      if (opts.skip?.includes(spec.name) || grouped.has(spec.name)) continue;
      const q = this.layers.get(spec.name);
      if (q) {
        const t = declareQuantizedLinear(g, p + spec.name, kernelLayout(q), how);
        kernels.set(spec.name, t);
        for (const x of [t.b, 'scales' in t ? t.scales : t.absmax, 'zeroPoints' in t ? t.zeroPoints : undefined]) if (x) inputs.set(x.name, x);
      } else {
        const d = this.dense.get(spec.name)!;
        inputs.set(p + spec.name, opts.inline ? g.initializer(p + spec.name, 'float32', spec.shape, { kind: 'inline', bytes: new Uint8Array(d.buffer, d.byteOffset, d.byteLength) }) : g.input(p + spec.name, opts.dtype, spec.shape));
      }
    }
    let head: { name: string; t: QuantizedLinearTensors } | undefined;
    if (this.lmHead && !opts.skip?.includes(this.lmHead.name)) {
      const t = declareQuantizedLinear(g, `${p}${HEAD_PREFIX}${this.lmHead.name}`, kernelLayout(this.lmHead.matrix), how);
      for (const x of [t.b, 'scales' in t ? t.scales : t.absmax, 'zeroPoints' in t ? t.zeroPoints : undefined]) if (x) inputs.set(x.name, x);
      head = { name: this.lmHead.name, t };
    }
    const cast = new Map<string, Tensor>();
    const weights: Weights = (name) => {
      if (kernels.has(name) || grouped.has(name)) throw new Error(`weight '${name}' is quantized (${this.scheme.format}): it is read through its kernel, not as a dense tensor`);
      const t = inputs.get(p + name);
      if (!t) throw new Error(`weight '${name}' is not a parameter of this ${this.config.architecture}`);
      if (t.dtype === opts.dtype) return t;
      let c = cast.get(name);
      if (!c) cast.set(name, (c = L.Graph.build(t.graph, () => L.cast(t, opts.dtype))));
      return c;
    };
    // The pipeline's projections: every INT4 one it takes, fused groups as one, in paramSpecs' order (the model's reading order).
    const piped = new Map<string, NBitsPipelineProjection>();
    if (own && opts.pipeline && (opts.mode ?? 'kernel') === 'kernel') {
      for (const spec of paramSpecs(this.config)) {
        const member = grouped.get(spec.name);
        const key = member ? member.group.name : spec.name;
        const t = member ? member.t : kernels.get(spec.name);
        if (piped.has(key) || !t || t.op !== 'MatMulNBits' || opts.pipeline.unsupported(t.attrs, opts.dtype) !== undefined) continue;
        piped.set(key, { key, b: t.b, scales: t.scales, zeroPoints: t.zeroPoints, attrs: t.attrs, ...(member ? { widths: member.group.widths } : {}) });
      }
    }
    let pipe: ((key: string, x: Tensor, packed?: boolean) => Tensor[]) | undefined;
    const viaPipeline = (key: string | undefined, x: Tensor, t: QuantizedLinearTensors, packed = false): Tensor[] | undefined => {
      if (key === undefined || !piped.has(key) || t.op !== 'MatMulNBits' || takesKernel(own!, x, t.attrs, opts.kernelMaxRows)) return undefined;
      pipe ??= opts.pipeline!.pipeline([...piped.values()]);
      return pipe(key, x, packed);
    };
    const project = (x: Tensor, t: QuantizedLinearTensors, key?: string): Tensor => {
      if (own && t.op === 'MatMulNBits' && (opts.mode ?? 'kernel') === 'kernel' && takesKernel(own, x, t.attrs, opts.kernelMaxRows)) return own.matmul(x, t.b, t.scales, t.zeroPoints, t.attrs);
      const p = viaPipeline(key, x, t);
      if (p) return p[0];
      return quantizedMatmul(x, t, opts.mode ?? 'kernel', opts.backward);
    };
    // A group's outputs for the input they were computed from: the other members asked with the same x reuse them.
    const fusedOut = new Map<FusedProjection, { x: Tensor; outs: Tensor[] }>();
    const projectGroup = (x: Tensor, group: FusedProjection, t: QuantizedLinearTensors): Tensor[] => {
      const hit = fusedOut.get(group);
      if (hit && hit.x === x) return hit.outs;
      let outs: Tensor[];
      const kernelTakes = own && t.op === 'MatMulNBits' && (opts.mode ?? 'kernel') === 'kernel' && takesKernel(own, x, t.attrs, opts.kernelMaxRows);
      const p = kernelTakes ? undefined : viaPipeline(group.name, x, t);
      if (kernelTakes && own && t.op === 'MatMulNBits') outs = own.matmulSplit(x, t.b, t.scales, t.zeroPoints, t.attrs, group.widths);
      else if (p) outs = p;
      else {
        const y = quantizedMatmul(x, t, opts.mode ?? 'kernel', opts.backward);
        const axis = y.rank - 1;
        let start = 0;
        outs = group.widths.map((w) => L.slice(y, [axis], [start], [(start += w)]));
      }
      fusedOut.set(group, { x, outs });
      return outs;
    };
    // A group through the pipeline hands its product over packed (one GEMM) to consumers that read it so (Weights.packed).
    weights.packed = (group, prefix, x) => {
      const key = `${prefix}.${group === 'qkv' ? 'qkv_proj' : 'gate_up_proj'}.weight`;
      const member = [...grouped.values()].find((m) => m.group.name === key);
      return member ? viaPipeline(key, x, member.t, true)?.[0] : undefined;
    };
    weights.matmul = (name, x) => {
      // The quantized head is asked for by the head's name (lmLogits); the dense one stays readable.
      if (head && name === head.name) return project(x, head.t);
      const member = grouped.get(name);
      if (member) return projectGroup(x, member.group, member.t)[member.index];
      const t = kernels.get(name);
      return t ? project(x, t, name) : undefined;
    };
    return { weights, inputs };
  }

  /**
   * The tensors {@link graphWeights} declares as inputs (names after `prefix`), uploaded to
   * `device`: dense parameters and scales in `dtype`, codes as uint8. With `quantizedWeights:
   * 'initializers'` the kernel tensors are in the graphs, so only the dense parameters are uploaded.
   */
  deviceTensors(device: Device, dtype: DType, prefix = '', opts: { quantizedWeights?: QuantizedWeightsAs } = {}): Map<string, DeviceTensor> {
    const kernelTensors = opts.quantizedWeights !== 'initializers';
    // 'kernel': the fused projections' concatenated tensors in place of their members'
    const groups = opts.quantizedWeights === 'kernel' ? this.fusedProjections() : [];
    const grouped = new Set(groups.flatMap((gr) => gr.members));
    const out = new Map<string, DeviceTensor>();
    const upload = (name: string, data: Float32Array | Uint8Array, shape: number[], dt: DType) => {
      const host = data instanceof Uint8Array ? data : dt === 'bfloat16' ? toBfloat16Bits(data) : dt === 'float16' ? toFloat16Bits(data) : data;
      out.set(prefix + name, device.upload({ data: host, dims: shape }, dt));
    };
    try {
      for (const spec of paramSpecs(this.config)) {
        const q = this.layers.get(spec.name);
        if (!q) upload(spec.name, this.dense.get(spec.name)!, spec.shape, dtype);
        else if (kernelTensors && !grouped.has(spec.name)) for (const s of kernelTensorSpecs(spec.name, kernelLayout(q), dtype)) upload(s.name, s.data, s.shape, s.dtype);
      }
      for (const gr of groups) for (const s of kernelTensorSpecs(gr.name, gr.layout, dtype)) upload(s.name, s.data, s.shape, s.dtype);
      if (this.lmHead && kernelTensors) for (const s of kernelTensorSpecs(`${HEAD_PREFIX}${this.lmHead.name}`, kernelLayout(this.lmHead.matrix), dtype)) upload(s.name, s.data, s.shape, s.dtype);
    } catch (e) {
      for (const t of out.values()) t.dispose();
      throw e;
    }
    return out;
  }

  /**
   * What a generator over this frozen model needs (KvCacheGenerator.create(device, config,
   * tensors, { graphWeights, session, … })). By default the kernel tensors are bound inputs, since
   * ONNX Runtime 1.29's fused weight-only GEMM measured slower than its default kernels at batch 1,
   * 16 and 256 (docs/benchmarks.md). `quantizedWeights: 'initializers'` makes them initializers
   * of the generation graphs, and on CUDA with MatMulNBits layers (INT8, INT4) and a 16-bit dtype
   * turns the fused GEMM on ({@link fusedGemmSession}; not for NF4 — MatMulBnb4 has no prepacked
   * path — or `mode: 'dequantize'`). Each session then holds its own prepacked copy of the quantized
   * weights (prefill and decode: twice the quantized bytes); `tensors` holds the rest. `quantizedWeights: 'kernel'`: bound
   * kernel tensors, the INT4 projections of decode steps through `kernel` (Lathe's W4A16 op,
   * `w4a16Ops` of @lathe/kernels; see {@link graphWeights}), and the op's domain in `session`.
   * Dispose `tensors` after the generator.
   */
  generation(device: Device, dtype: DType, opts: GenerationOptions = {}): QuantizedGeneration {
    const mode = opts.mode ?? 'kernel';
    const plan = this.generationPlan(device.kind, dtype, opts);
    return {
      ...plan,
      tensors: this.deviceTensors(device, dtype, '', { quantizedWeights: plan.quantizedWeights }),
      graphWeights: (g) => this.graphWeights(g, { dtype, mode, quantizedWeights: plan.quantizedWeights, kernel: opts.kernel, kernelMaxRows: opts.kernelMaxRows, pipeline: opts.pipeline }).weights,
      session: plan.fusedGemm ? fusedGemmSession() : plan.quantizedWeights === 'kernel' ? kernelSession(opts.kernel!, opts.pipeline) : {},
    };
  }

  /** How {@link generation} reads the weights on a device of `kind` in `dtype` (its defaults, or `opts` checked). */
  generationPlan(kind: DeviceKind, dtype: DType, opts: GenerationOptions = {}): Pick<QuantizedGeneration, 'quantizedWeights' | 'fusedGemm' | 'fusedLayers' | 'kernelLayers'> {
    const nbits = this.nbitsLayouts();
    if (opts.pipeline && opts.quantizedWeights !== 'kernel') throw new Error(`generation: the INT4 pipeline (opts.pipeline) needs quantizedWeights 'kernel', got '${opts.quantizedWeights ?? 'inputs'}'`);
    if (opts.quantizedWeights === 'kernel') {
      if (!opts.kernel) throw new Error(`generation: quantizedWeights 'kernel' needs the kernel (w4a16Ops of @lathe/kernels, on the device's kernels) as opts.kernel`);
      if (opts.fusedGemm) throw new Error(`generation: the fused weight-only GEMM needs quantizedWeights 'initializers', not 'kernel'`);
      const kernel = opts.kernel;
      const kernelLayers = (opts.mode ?? 'kernel') === 'kernel' ? nbits.filter((l) => kernel.unsupported(l.attrs, dtype) === undefined).length : 0;
      return { quantizedWeights: 'kernel', fusedGemm: false, fusedLayers: 0, kernelLayers };
    }
    const eligible = nbits.filter((l) => !fusedGemmIneligibility(l.attrs, dtype)).length;
    const fusable = kind === 'cuda' && (opts.mode ?? 'kernel') === 'kernel' && eligible > 0;
    const quantizedWeights = opts.quantizedWeights ?? 'inputs';
    const fusedGemm = opts.fusedGemm ?? (fusable && quantizedWeights === 'initializers');
    if (fusedGemm && quantizedWeights !== 'initializers') throw new Error(`generation: the fused weight-only GEMM needs quantizedWeights 'initializers' (ONNX Runtime prepacks only initializers; bound inputs fail at the first run)`);
    return { quantizedWeights, fusedGemm, fusedLayers: fusedGemm ? eligible : 0 };
  }

  private fused?: FusedProjection[];

  /**
   * The projections `quantizedWeights: 'kernel'` runs as one (see {@link FUSED_PROJECTIONS}): every
   * group whose members are all INT4 with the same K, block size and zero-point choice, its kernel
   * layout the members' concatenated along N (computed once).
   */
  fusedProjections(): FusedProjection[] {
    if (this.fused) return this.fused;
    const groups: FusedProjection[] = [];
    for (const [name] of this.layers) {
      for (const f of FUSED_PROJECTIONS) {
        if (!name.endsWith(`.${f.members[0]}`)) continue;
        const stem = name.slice(0, name.length - f.members[0].length);
        const members = f.members.map((m) => stem + m);
        const mats = members.map((m) => this.layers.get(m));
        if (mats.some((m) => !m || m.format !== 'int4')) continue;
        const layouts = mats.map((m) => kernelLayout(m!) as NBitsLayout);
        const [first] = layouts;
        if (layouts.some((l) => l.attrs.K !== first.attrs.K || l.attrs.blockSize !== first.attrs.blockSize || !l.zeroPoints !== !first.zeroPoints)) continue;
        groups.push({ name: stem + f.fused, members, widths: layouts.map((l) => l.attrs.N), layout: concatNBits(layouts) });
      }
    }
    return (this.fused = groups);
  }

  /**
   * The distinct INT4 weight shapes the `quantizedWeights: 'kernel'` graphs can send through the
   * kernel: each fused group's concatenated [N, K] ({@link fusedProjections}), every other INT4
   * layer's, and an INT4 head's, labelled by the first name after the layer prefix — the shapes
   * `tuneW4A16` of @lathe/kernels measures launch plans for.
   */
  kernelShapes(): { name: string; N: number; K: number; blockSize: number }[] {
    const grouped = new Set(this.fusedProjections().flatMap((g) => g.members));
    const found = [
      ...this.fusedProjections().map((g) => ({ name: g.name, layout: g.layout })),
      ...[...this.layers].filter(([name, m]) => m.format === 'int4' && !grouped.has(name)).map(([name, m]) => ({ name, layout: kernelLayout(m) as NBitsLayout })),
      ...(this.lmHead?.matrix.format === 'int4' ? [{ name: this.lmHead.name, layout: kernelLayout(this.lmHead.matrix) as NBitsLayout }] : []),
    ];
    const out = new Map<string, { name: string; N: number; K: number; blockSize: number }>();
    for (const { name, layout } of found) {
      const { N, K, blockSize } = layout.attrs;
      const key = `${N}x${K}/${blockSize}`;
      if (!out.has(key)) out.set(key, { name: name.replace(/^model\.layers\.\d+\./, '').replace(/\.weight$/, ''), N, K, blockSize });
    }
    return [...out.values()];
  }

  /** The MatMulNBits layouts of the quantized layers and head (INT8, INT4). */
  private nbitsLayouts(): NBitsLayout[] {
    const all = [...this.layers.values(), ...(this.lmHead ? [this.lmHead.matrix] : [])].map(kernelLayout);
    return all.filter((l): l is NBitsLayout => l.op === 'MatMulNBits');
  }

  /** Bits per parameter and the layers padded to whole blocks. `denseBits`: the dense parameters' storage (default 16). */
  report(denseBits = 16): QuantizationReport {
    let qParams = 0;
    let qBytes = 0;
    const padded: string[] = [];
    for (const [name, m] of this.layers) {
      qParams += m.rows * m.cols;
      qBytes += storedBytes(m);
      if (isPadded(m)) padded.push(name);
    }
    let denseParams = 0;
    for (const d of this.dense.values()) denseParams += d.length;
    const total = qParams + denseParams;
    return {
      format: this.scheme.format,
      layers: this.layers.size,
      quantizedParams: qParams,
      totalParams: total,
      bitsPerQuantizedWeight: qParams ? (8 * qBytes) / qParams : 0,
      bitsPerParameter: (8 * qBytes + denseBits * denseParams) / total,
      denseBits,
      padded,
      ...(this.lmHead ? { lmHead: { format: this.lmHead.scheme.format, bytes: storedBytes(this.lmHead.matrix) } } : {}),
    };
  }
}

/**
 * Where a graph reads a quantized model's kernel tensors: bound inputs (default), initializers
 * holding the bytes, or bound inputs read by Lathe's own INT4 kernel in decode steps (`kernel`).
 */
export type QuantizedWeightsAs = 'inputs' | 'initializers' | 'kernel';

/** Options of {@link QuantizedModel.generation}. */
export interface GenerationOptions {
  quantizedWeights?: QuantizedWeightsAs;
  /** ONNX Runtime's fused weight-only GEMM (needs `initializers`). */
  fusedGemm?: boolean;
  mode?: QuantizedMatmulMode;
  /** With `quantizedWeights: 'kernel'`: the kernel (`w4a16Ops(device.kind, W4A16.compile(kernels))` of @lathe/kernels). */
  kernel?: NBitsKernel;
  /** With `quantizedWeights: 'kernel'`: the most rows a projection sends through the kernel (default {@link KERNEL_MAX_ROWS}: 64). */
  kernelMaxRows?: number;
  /**
   * With `quantizedWeights: 'kernel'`: INT4 products of more rows than that (and prefill's) through this pipeline
   * (`w4a16GemmOps(device.kind, W4A16Gemm.create(kernels))` of @lathe/kernels) instead of MatMulNBits.
   */
  pipeline?: NBitsPipeline;
}

/** The session options of a generation through Lathe's kernel (and pipeline): both custom-op domains. */
function kernelSession(kernel: NBitsKernel, pipeline: NBitsPipeline | undefined): SessionOptions {
  return { ...kernel.session, customOpDomains: [...(kernel.session.customOpDomains ?? []), ...(pipeline?.session.customOpDomains ?? [])] };
}

/** See {@link QuantizedModel.generation}. */
export interface QuantizedGeneration {
  /** The device tensors the graphs read as inputs, by name (the caller disposes them). */
  tensors: Map<string, DeviceTensor>;
  graphWeights: (g: Graph) => Weights;
  /** Session options for the generator's sessions (the fused path's config entry, when on). */
  session: SessionOptions;
  quantizedWeights: QuantizedWeightsAs;
  /** Whether ONNX Runtime's fused weight-only GEMM is asked for. */
  fusedGemm: boolean;
  /** Projections that can take the fused path (the rest run ORT's other MatMulNBits paths). */
  fusedLayers: number;
  /** With `quantizedWeights: 'kernel'`: projections the kernel takes (in decode steps). */
  kernelLayers?: number;
}

/**
 * Projections that read the same input, by their names after the layer's prefix: `quantizedWeights:
 * 'kernel'` holds each group's INT4 weights concatenated along N under the `fused` name and runs them
 * as one node (one kernel launch a group in decode steps instead of one a projection).
 */
export const FUSED_PROJECTIONS: readonly { fused: string; members: readonly string[] }[] = [
  { fused: 'self_attn.qkv_proj.weight', members: ['self_attn.q_proj.weight', 'self_attn.k_proj.weight', 'self_attn.v_proj.weight'] },
  { fused: 'mlp.gate_up_proj.weight', members: ['mlp.gate_proj.weight', 'mlp.up_proj.weight'] },
];

/** A group of {@link FUSED_PROJECTIONS} in one model: its fused name, members (HF names), their widths (N each) and the concatenated layout. */
export interface FusedProjection {
  name: string;
  members: string[];
  widths: number[];
  layout: NBitsLayout;
}

/** MatMulNBits layouts of one K, block size and zero-point choice, stacked along N (rows are independent). */
export function concatNBits(layouts: readonly NBitsLayout[]): NBitsLayout {
  const [first] = layouts;
  const cat = <T extends Uint8Array | Float32Array>(parts: T[], make: (n: number) => T): T => {
    const out = make(parts.reduce((n, x) => n + x.length, 0));
    let at = 0;
    for (const x of parts) {
      out.set(x, at);
      at += x.length;
    }
    return out;
  };
  const N = layouts.reduce((n, l) => n + l.attrs.N, 0);
  return {
    op: 'MatMulNBits',
    b: cat(layouts.map((l) => l.b), (n) => new Uint8Array(n)),
    bShape: [N, first.bShape[1], first.bShape[2]],
    scales: cat(layouts.map((l) => l.scales), (n) => new Float32Array(n)),
    ...(first.zeroPoints ? { zeroPoints: cat(layouts.map((l) => l.zeroPoints!), (n) => new Uint8Array(n)) } : {}),
    attrs: { ...first.attrs, N },
  };
}

/** Graph-name prefix of the quantized LM head's kernel tensors (beside the dense head of the same HF name). */
export const HEAD_PREFIX = 'quantized_head/';

/** The quantized copy of the LM head (the embedding when tied). */
function quantizedHead(config: DecoderConfig, dense: ReadonlyMap<string, Float32Array>, scheme: QuantScheme): { name: string; scheme: QuantScheme; matrix: QuantizedMatrix } {
  checkScheme(scheme);
  const name = lmHeadName(config);
  const w = dense.get(name);
  if (!w) throw new Error(`lm head: '${name}' is quantized as a layer; the quantized head is a copy of a dense head`);
  return { name, scheme: schemeOf(scheme), matrix: quantizeMatrix(w, config.vocabSize, config.hiddenSize, scheme) };
}

/** One matrix in the scheme's format. */
export function quantizeMatrix(w: Float32Array, N: number, K: number, s: QuantScheme): QuantizedMatrix {
  if (s.format === 'int8') return quantizeInt8(w, N, K);
  if (s.format === 'int4') return quantizeInt4(w, N, K, { blockSize: s.blockSize, zeroPoints: s.zeroPoints });
  if (s.format === 'nf4') return quantizeNf4(w, N, K, { blockSize: s.blockSize, doubleQuant: s.doubleQuant });
  throw new Error(`unknown quantization format '${String((s as { format: unknown }).format)}' (int8, int4, nf4)`);
}

/** Refuses an unknown format or a block size the format does not take, before any work. */
export function checkScheme(s: QuantScheme): void {
  if (!QUANT_FORMATS.includes(s.format)) throw new Error(`unknown quantization format '${String(s.format)}' (${QUANT_FORMATS.join(', ')})`);
  if (s.format === 'int4' && s.blockSize !== undefined && !INT4_BLOCK_SIZES.includes(s.blockSize)) throw new Error(`int4 block size ${s.blockSize} is not one of ${INT4_BLOCK_SIZES.join(', ')}`);
  if (s.format === 'nf4' && s.blockSize !== undefined && s.blockSize !== 64) throw new Error(`nf4 block size ${s.blockSize}: bitsandbytes' NF4 uses 64`);
  if (s.doubleQuant && s.format !== 'nf4') throw new Error(`double quantization is for nf4, not ${s.format}`);
  if (s.zeroPoints && s.format !== 'int4') throw new Error(`zero points are for int4, not ${s.format}`);
}

/** Whether a matrix's kernel layout pads K to whole blocks. */
function isPadded(m: QuantizedMatrix): boolean {
  const l: NBitsLayout | Bnb4Layout = kernelLayout(m);
  return l.op === 'MatMulNBits' && kBlocks(m.cols, l.attrs.blockSize) * l.attrs.blockSize !== m.cols;
}

function schemeOf(o: QuantScheme): QuantScheme {
  if (o.format === 'int8') return { format: 'int8' };
  if (o.format === 'int4') return { format: 'int4', blockSize: o.blockSize ?? 64, zeroPoints: o.zeroPoints ?? false };
  return { format: o.format, blockSize: o.blockSize ?? 64, doubleQuant: o.doubleQuant ?? false };
}
