/**
 * Device tensors: ORT values in a device's memory (GPU memory on CUDA), owned by JavaScript objects.
 * They stay where they are between runs; only `upload`/`download` cross the host boundary.
 *
 * Lifetime: `dispose()` frees the memory at once. A tensor that is garbage-collected without
 * `dispose()` is freed by a finalizer and counted as a leak (Device.memory().leaked, and a warning),
 * because GPU memory should not wait for the JavaScript GC.
 */
import { writeSync } from 'node:fs';
import { dtypeFromOnnxCode, onnxTypeCode, type DType } from '@lathe/onnx';
import type { Ptr } from './capi';
import { ortEnv, trace } from './env';
import { byteSize, checkHostTensor, hostArrayType, sizeOf, type HostArray, type HostTensor } from './host';
import type { Device } from './device';

interface Finalized {
  handle: Ptr;
  device: Device;
  bytes: number;
  owned: boolean;
  /** Where the tensor was made (LATHE_TRACE_LEAKS=1 only: capturing a stack costs). */
  stack?: string;
}

/** LATHE_TRACE_LEAKS=1: each leaked tensor's allocation stack goes to stderr when the GC finds it. */
const TRACE_LEAKS = process.env.LATHE_TRACE_LEAKS === '1';

const finalizer = new FinalizationRegistry<Finalized>((f) => {
  trace(`finalize ${f.bytes} bytes`);
  ortEnv().api.fn('ReleaseValue')(f.handle);
  f.device.noteFreed(f.bytes, f.owned, true);
  if (f.stack && f.owned) writeSync(2, `[lathe-leak] a ${f.bytes}-byte tensor was garbage-collected without dispose(); allocated ${f.stack.replace(/^Error\n/, '\n')}\n`);
});

/** Reads the element type and dims of an OrtValue holding a tensor. */
export function tensorTypeOf(handle: Ptr): { dtype: DType; dims: number[] } {
  const { api } = ortEnv();
  const info = api.out('GetTensorTypeAndShape', handle);
  try {
    const code = api.outNumber('GetTensorElementType', info);
    const rank = api.outNumber('GetDimensionsCount', info);
    const dims = new BigInt64Array(Math.max(rank, 1));
    if (rank > 0) api.call('GetDimensions', info, dims, rank);
    return { dtype: dtypeFromOnnxCode(code), dims: Array.from(dims.subarray(0, rank), Number) };
  } finally {
    api.fn('ReleaseTensorTypeAndShapeInfo')(info);
  }
}

/** A tensor in a device's memory. */
export class DeviceTensor {
  private released = false;

  /** @internal Use `device.empty/zeros/upload`, not the constructor. */
  constructor(
    /** Where the tensor lives. */
    readonly device: Device,
    /** @internal The OrtValue. */
    readonly handle: Ptr,
    readonly dtype: DType,
    readonly dims: readonly number[],
    /** For views: the tensor that owns the memory (kept alive by this reference). */
    private readonly parent?: DeviceTensor,
  ) {
    const owned = !parent;
    device.noteAllocated(this.byteLength, owned);
    finalizer.register(this, { handle, device, bytes: this.byteLength, owned, ...(TRACE_LEAKS ? { stack: new Error().stack } : {}) }, this);
  }

  /** Element count. */
  get size(): number {
    return sizeOf(this.dims);
  }

  /** Bytes of memory the tensor spans. */
  get byteLength(): number {
    return byteSize(this.dtype, this.dims);
  }

  /** Whether `dispose()` has been called. */
  get disposed(): boolean {
    return this.released;
  }

  /** @internal Throws if the tensor was disposed. */
  live(what = 'tensor'): Ptr {
    if (this.released) throw new Error(`${what}: ${this.describe()} was disposed`);
    if (this.parent) this.parent.live(what);
    return this.handle;
  }

  /** @internal Address of the first element. */
  dataPointer(): Ptr {
    return ortEnv().api.out('GetTensorMutableData', this.live());
  }

  /**
   * The device address of the first element (a `CUdeviceptr` on CUDA), for kernels that read or
   * write the tensor in place (`@lathe/kernels`). Valid until the tensor (or, for a view, its
   * parent) is disposed; the tensor never moves.
   */
  devicePointer(): bigint {
    return this.dataPointer();
  }

  /** "float32[2, 3] on cuda:0". */
  describe(): string {
    return `${this.dtype}[${this.dims.join(', ')}] on ${this.device.name}`;
  }

  /**
   * A tensor with other dims over the same memory (same element count). The view keeps this
   * tensor alive; disposing this tensor invalidates the view.
   */
  reshape(dims: readonly number[]): DeviceTensor {
    if (sizeOf(dims) !== this.size) throw new Error(`reshape: ${this.describe()} has ${this.size} elements, [${dims.join(', ')}] has ${sizeOf(dims)}`);
    const { api } = ortEnv();
    const handle = api.out('CreateTensorWithDataAsOrtValue', this.device.memoryInfo, this.dataPointer(), this.byteLength, BigInt64Array.from(dims.map(BigInt)), dims.length, onnxTypeCode(this.dtype));
    return new DeviceTensor(this.device, handle, this.dtype, [...dims], this.parent ?? this);
  }

  /**
   * A view of the first `n` entries along the first axis (the same memory's leading part: rows of a
   * row-major tensor are contiguous). The view keeps this tensor alive; disposing this tensor
   * invalidates the view.
   */
  leading(n: number): DeviceTensor {
    const rows = this.dims[0];
    if (this.dims.length === 0 || !Number.isInteger(n) || n < 1 || n > rows) throw new Error(`leading: ${n} rows of ${this.describe()} (1..${rows ?? 0})`);
    const dims = [n, ...this.dims.slice(1)];
    const { api } = ortEnv();
    const handle = api.out('CreateTensorWithDataAsOrtValue', this.device.memoryInfo, this.dataPointer(), byteSize(this.dtype, dims), BigInt64Array.from(dims.map(BigInt)), dims.length, onnxTypeCode(this.dtype));
    return new DeviceTensor(this.device, handle, this.dtype, dims, this.parent ?? this);
  }

  /** Copies host data into the tensor (same element count; dims may differ). */
  upload(src: HostArray | HostTensor): void {
    const data = ArrayBuffer.isView(src) ? src : src.data;
    checkHostTensor(`upload into ${this.describe()}`, this.dtype, { data, dims: [data.length] });
    if (data.length !== this.size) throw new Error(`upload: ${data.length} elements into ${this.describe()}`);
    this.device.writeFromHost(this, data);
  }

  /** Copies the tensor to host memory (synchronous; waits for pending GPU work on the copy stream). */
  download(): HostTensor {
    const Type = hostArrayType(this.dtype);
    const data = new Type(this.size);
    this.device.readToHost(this, data);
    return { data, dims: [...this.dims] };
  }

  /** Sets every element to `value`. */
  fill(value: number | bigint): void {
    this.device.fillTensor(this, value);
  }

  /** Copies another tensor's elements (same dtype and element count) into this one, on the device. */
  copyFrom(src: DeviceTensor): void {
    if (src.dtype !== this.dtype || src.size !== this.size) throw new Error(`copyFrom: ${src.describe()} into ${this.describe()} (dtype and element count must match)`);
    this.device.copyTensor(src, this);
  }

  /** Frees the tensor's memory now (views: just the view). Safe to call twice. */
  dispose(): void {
    if (this.released) return;
    this.released = true;
    finalizer.unregister(this);
    ortEnv().api.fn('ReleaseValue')(this.handle);
    this.device.noteFreed(this.byteLength, !this.parent, false);
  }
}
