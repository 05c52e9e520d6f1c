/**
 * Lathe's kernels as nodes of an ONNX Runtime session: an ORT custom op (the C API's `OrtCustomOp`
 * table) whose compute is a JavaScript function called back through koffi. The function gets the
 * node's inputs as (address, dtype, dims) and allocates its outputs through ORT, so the op sits in
 * one session with ORT's memory planning — on CUDA it launches a kernel on the device's compute
 * stream (the session's own when the device was opened with `Kernels.withDevice`), on the CPU it
 * computes on the host. The alternative to splitting a graph (split.ts) for single-node kernels.
 *
 * The table is the first twelve fields of `OrtCustomOp` (version 8: create/destroy, name, provider,
 * input and output types, compute, and the input/output characteristics, which ORT's schema check
 * reads whatever the version); ORT reads the later fields only for later versions, and they stay null.
 */
import * as koffi from 'koffi';
import { dtypeFromOnnxCode, onnxTypeCode, type DType, type OpDef, type Tensor, type TensorType } from '@lathe/onnx';
import * as L from '@lathe/onnx';
import { CApi, namedKoffiType, type DeviceKind } from '@lathe/runtime';

/** `n` elements of host memory at `p` (a CPU compute's input) as a typed array: the float32 host paths' reads. */
function readHost<A extends Float32Array | Int32Array | BigInt64Array | Uint8Array>(make: new (n: number) => A, p: bigint, n: number): A {
  const a = new make(n);
  CApi.get().copyOut(a, p);
  return a;
}
/** {@link readHost} of float32. */
export const readF32 = (p: bigint, n: number): Float32Array => readHost(Float32Array, p, n);
/** {@link readHost} of int32. */
export const readI32 = (p: bigint, n: number): Int32Array => readHost(Int32Array, p, n);
/** {@link readHost} of int64. */
export const readI64 = (p: bigint, n: number): BigInt64Array => readHost(BigInt64Array, p, n);
/** {@link readHost} of bytes. */
export const readBytes = (p: bigint, n: number): Uint8Array => readHost(Uint8Array, p, n);

/** One input of a custom op's compute. */
export interface CustomOpInput {
  /** Address of the first element (device memory on CUDA). */
  data: bigint;
  dtype: DType;
  dims: number[];
}

/** What a custom op's compute receives: its inputs, and a way to allocate each output. */
export interface CustomOpContext {
  inputs: CustomOpInput[];
  /** Allocates output `index` with `dims` (its dtype is the op's) and returns its address. */
  output(index: number, dims: readonly number[]): bigint;
}

/** A custom op: its name, types, the provider it runs on, and its compute. */
export interface CustomOpSpec {
  name: string;
  /** Element types of the inputs and outputs, in order. */
  inputs: DType[];
  outputs: DType[];
  /** `cuda` → CUDAExecutionProvider, `cpu` → CPUExecutionProvider. */
  provider: DeviceKind;
  /** The output types from the input types, for graph building (defaults: each output like input 0). */
  infer?: (inputs: TensorType[]) => TensorType[];
  /** The kernel: must not throw (an error is kept and rethrown by `CustomOpDomain.check`). */
  compute: (ctx: CustomOpContext) => void;
}

const OP_VERSION = 8;
/** Slots of the table: the twelve version-8 fields, and nulls where later versions add fields. */
const FIELDS = 32;
/** `OrtCustomOpInputOutputCharacteristic`: every input and output is required. */
const REQUIRED = 0;

type Fn = (...args: unknown[]) => unknown;

function proto(name: string, signature: string): koffi.TypeObject {
  return namedKoffiType(name, () => koffi.proto(signature.replace('FN', name)));
}

/** A custom-op domain: its ops' tables and callbacks stay alive as long as this object. */
export class CustomOpDomain {
  /** The `OrtCustomOpDomain` handle to pass in `SessionOptions.customOpDomains`. */
  readonly handle: bigint;
  private readonly keep: unknown[] = [];
  private readonly callbacks: bigint[] = [];
  private readonly errors: Error[] = [];
  private readonly ops = new Map<string, OpDef<object>>();
  private released = false;

  constructor(readonly domain: string) {
    this.handle = CApi.get().out('CreateCustomOpDomain', domain);
    this.keep.push(domain);
  }

  /** Adds an op to the domain; returns the op definition to build its nodes with (`node`). */
  add(spec: CustomOpSpec): OpDef<object> {
    const api = CApi.get();
    const cString = (s: string) => {
      const b = Buffer.from(`${s}\0`, 'utf8');
      this.keep.push(b);
      return koffi.address(b) as bigint;
    };
    const name = cString(spec.name);
    const provider = cString(spec.provider === 'cuda' ? 'CUDAExecutionProvider' : 'CPUExecutionProvider');
    const reg = (protoName: string, signature: string, fn: Fn) => {
      const cb = koffi.register(fn, koffi.pointer(proto(protoName, signature)));
      this.callbacks.push(cb);
      return cb;
    };
    const table = new BigUint64Array(FIELDS);
    table[0] = BigInt(OP_VERSION);
    const compute = (_kernel: unknown, context: bigint) => {
      try {
        spec.compute(this.context(api, context, spec));
      } catch (e) {
        this.errors.push(e instanceof Error ? e : new Error(String(e)));
      }
    };
    const fields: [string, string, Fn][] = [
      ['LatheCustomOpCreateKernel', 'void* FN(void* op, void* api, void* info)', () => name],
      ['LatheCustomOpGetName', 'void* FN(void* op)', () => name],
      ['LatheCustomOpGetProvider', 'void* FN(void* op)', () => provider],
      ['LatheCustomOpGetInputType', 'int FN(void* op, size_t index)', (_op, i) => onnxTypeCode(spec.inputs[Number(i)])],
      ['LatheCustomOpGetInputTypeCount', 'size_t FN(void* op)', () => spec.inputs.length],
      ['LatheCustomOpGetOutputType', 'int FN(void* op, size_t index)', (_op, i) => onnxTypeCode(spec.outputs[Number(i)])],
      ['LatheCustomOpGetOutputTypeCount', 'size_t FN(void* op)', () => spec.outputs.length],
      ['LatheCustomOpKernelCompute', 'void FN(void* kernel, void* context)', compute as Fn],
      ['LatheCustomOpKernelDestroy', 'void FN(void* kernel)', () => undefined],
      ['LatheCustomOpGetInputCharacteristic', 'int FN(void* op, size_t index)', () => REQUIRED],
      ['LatheCustomOpGetOutputCharacteristic', 'int FN(void* op, size_t index)', () => REQUIRED],
    ];
    fields.forEach(([n, sig, fn], i) => (table[i + 1] = reg(n, sig, fn)));
    this.keep.push(table);
    api.call('CustomOpDomain_Add', this.handle, koffi.address(table.buffer) as bigint);
    const op: OpDef<object> = {
      name: spec.name,
      domain: this.domain,
      infer: (inputs) => (spec.infer ? spec.infer(inputs as TensorType[]) : spec.outputs.map((dtype) => ({ dtype, shape: [...inputs[0]!.shape] }))),
      grad: 'none',
    };
    this.ops.set(spec.name, op);
    return op;
  }

  /** A node of op `name` in the graph of `inputs`. */
  node(name: string, inputs: Tensor[]): Tensor[] {
    const op = this.ops.get(name);
    if (!op) throw new Error(`custom-op domain '${this.domain}' has no op '${name}' (ops: ${[...this.ops.keys()].join(', ')})`);
    return L.applyOp(op, inputs, {});
  }

  /** Rethrows the first error a compute raised since the last check (computes cannot throw into ORT). */
  check(): void {
    const e = this.errors.shift();
    this.errors.length = 0;
    if (e) throw new Error(`custom op in domain '${this.domain}' failed: ${e.message}`);
  }

  private context(api: CApi, context: bigint, spec: CustomOpSpec): CustomOpContext {
    const n = api.outNumber('KernelContext_GetInputCount', context);
    const inputs: CustomOpInput[] = [];
    for (let i = 0; i < n; i++) {
      const value = api.out('KernelContext_GetInput', context, i);
      const info = api.out('GetTensorTypeAndShape', value);
      try {
        const rank = api.outNumber('GetDimensionsCount', info);
        const dims = new BigInt64Array(Math.max(rank, 1));
        if (rank > 0) api.call('GetDimensions', info, dims, rank);
        inputs.push({ data: api.out('GetTensorMutableData', value), dtype: dtypeFromOnnxCode(api.outNumber('GetTensorElementType', info)), dims: Array.from(dims.subarray(0, rank), Number) });
      } finally {
        api.fn('ReleaseTensorTypeAndShapeInfo')(info);
      }
    }
    return {
      inputs,
      output: (index, dims) => {
        if (index < 0 || index >= spec.outputs.length) throw new Error(`custom op '${spec.name}' has ${spec.outputs.length} outputs, asked for output ${index}`);
        const value = api.out('KernelContext_GetOutput', context, index, BigInt64Array.from(dims.map(BigInt)), dims.length);
        return dims.reduce((a, b) => a * b, 1) === 0 ? 0n : api.out('GetTensorMutableData', value);
      },
    };
  }

  /** Releases the domain and unregisters its callbacks (after every session using it is disposed). */
  dispose(): void {
    if (this.released) return;
    this.released = true;
    CApi.get().fn('ReleaseCustomOpDomain')(this.handle);
    for (const cb of this.callbacks.splice(0)) koffi.unregister(cb);
  }
}

/** Copies `values` to the memory at `p` (a CPU compute's output): the host paths' writes, beside {@link readF32}. */
export const writeHost = (p: bigint, values: ArrayBufferView): void => CApi.get().copyIn(p, values);

/** A kernel's custom ops as a session sees them: the domain to register, the error check and the release. */
export interface CustomOps {
  /** The custom-op domain: pass `domain.handle` in the session's `customOpDomains`. */
  domain: CustomOpDomain;
  /** Rethrows an error a compute raised (computes cannot throw into ONNX Runtime). */
  check(): void;
  /** Releases the domain (after every session using it is disposed). */
  dispose(): void;
}

/** What a kernel's op builder shares with the others: a fresh domain, the dtypes it takes, and its ops memoized by key. */
export interface OpFamily extends CustomOps {
  /** The dtypes the ops take: the kernels' on CUDA, float32 on the CPU (where computes run the host reference). */
  readonly dtypes: readonly DType[];
  /** How many ops {@link op} holds (before `define` adds one, while it runs). */
  readonly size: number;
  /** The op kept under `key`, made by `define` (which adds it to the domain) the first time it is asked for. */
  op(key: string, define: () => OpDef<object>): OpDef<object>;
  /** Throws `<name> (<provider>): no kernel for dtype <dtype> (takes …)` unless {@link dtypes} holds `dtype`. */
  supports(dtype: DType): void;
}

/** Domains made so far by prefix, so each builder's domains are `<prefix>0`, `<prefix>1`, … */
const domainCounts = new Map<string, number>();

/**
 * A new op family for graphs run on `provider`: its domain is `<domainPrefix><n>`, its dtypes
 * `cudaDtypes` on CUDA and float32 on the CPU, and `name` (the builder, e.g. `ropeOps`) leads its errors.
 */
export function opFamily(opts: { name: string; domainPrefix: string; provider: DeviceKind; cudaDtypes: readonly DType[] }): OpFamily {
  const n = domainCounts.get(opts.domainPrefix) ?? 0;
  domainCounts.set(opts.domainPrefix, n + 1);
  const domain = new CustomOpDomain(`${opts.domainPrefix}${n}`);
  const dtypes: readonly DType[] = opts.provider === 'cuda' ? [...opts.cudaDtypes] : ['float32'];
  const ops = new Map<string, OpDef<object>>();
  return {
    domain,
    dtypes,
    get size() {
      return ops.size;
    },
    op: (key, define) => {
      const known = ops.get(key);
      if (known) return known;
      const op = define();
      ops.set(key, op);
      return op;
    },
    supports: (dtype) => {
      if (!dtypes.includes(dtype)) throw new Error(`${opts.name} (${opts.provider}): no kernel for dtype ${dtype} (takes ${dtypes.join(', ')})`);
    },
    check: () => domain.check(),
    dispose: () => domain.dispose(),
  };
}
