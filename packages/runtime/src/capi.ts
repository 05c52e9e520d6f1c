/**
 * ONNX Runtime's C API, reached through the koffi FFI. This is the only file that touches koffi.
 *
 * `OrtGetApiBase()` returns a table of function pointers (`OrtApi`); entries are append-only across
 * releases, so an entry's index is fixed forever. The entries below are declared from the C API
 * header of ONNX Runtime 1.29 (`onnxruntime_c_api.h`, struct OrtApi) — index and C signature side by
 * side. Every function returning `OrtStatus*` goes through `check`, which turns a non-null status
 * into a JavaScript `OrtError` carrying ORT's message and error code, and releases the status.
 *
 * Pointers are koffi BigInts. Opaque ORT objects never leave this package's classes.
 */
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import * as koffi from 'koffi';

/** A native pointer (koffi represents pointers as BigInts). */
export type Ptr = bigint;

/** The koffi FFI's version. */
export const koffiVersion: string = (koffi as unknown as { version: string }).version;

/** The ORT API version Lathe asks for: the one of ONNX Runtime 1.29. */
export const ORT_API_VERSION = 29;

/** ORT's error codes (`OrtErrorCode`). */
export const ortErrorCodes = ['OK', 'FAIL', 'INVALID_ARGUMENT', 'NO_SUCHFILE', 'NO_MODEL', 'ENGINE_ERROR', 'RUNTIME_EXCEPTION', 'INVALID_PROTOBUF', 'MODEL_LOADED', 'NOT_IMPLEMENTED', 'INVALID_GRAPH', 'EP_FAIL', 'MODEL_LOAD_CANCELED', 'MODEL_REQUIRES_COMPILATION', 'NOT_FOUND'] as const;

/** An error reported by ONNX Runtime through an `OrtStatus`. */
export class OrtError extends Error {
  constructor(
    /** Which C API function failed. */
    readonly fn: string,
    /** ORT's error code name (e.g. `INVALID_ARGUMENT`). */
    readonly code: string,
    message: string,
  ) {
    super(`${fn}: ${message}`);
    this.name = 'OrtError';
  }
}

/**
 * The C signatures of the OrtApi entries Lathe uses, keyed by their index in the table. Functions
 * documented as `ORT_API2_STATUS` return `OrtStatus*` (null on success); `_Out_` parameters are
 * passed as one-element arrays.
 */
const entries = {
  CreateStatus: [0, 'void* CreateStatus(int code, const char* msg)'],
  GetErrorCode: [1, 'int GetErrorCode(void* status)'],
  GetErrorMessage: [2, 'const char* GetErrorMessage(void* status)'],
  CreateEnv: [3, 'void* CreateEnv(int log_level, const char* log_id, _Out_ void** out)'],
  CreateSession: [7, 'void* CreateSession(void* env, const char* model_path, void* options, _Out_ void** out)'],
  CreateSessionFromArray: [8, 'void* CreateSessionFromArray(void* env, const void* model_data, size_t model_data_length, void* options, _Out_ void** out)'],
  CreateSessionOptions: [10, 'void* CreateSessionOptions(_Out_ void** out)'],
  EnableProfiling: [14, 'void* EnableProfiling(void* options, const char* profile_file_prefix)'],
  EnableMemPattern: [16, 'void* EnableMemPattern(void* options)'],
  DisableMemPattern: [17, 'void* DisableMemPattern(void* options)'],
  EnableCpuMemArena: [18, 'void* EnableCpuMemArena(void* options)'],
  DisableCpuMemArena: [19, 'void* DisableCpuMemArena(void* options)'],
  SetSessionLogSeverityLevel: [22, 'void* SetSessionLogSeverityLevel(void* options, int level)'],
  SetSessionGraphOptimizationLevel: [23, 'void* SetSessionGraphOptimizationLevel(void* options, int level)'],
  SetIntraOpNumThreads: [24, 'void* SetIntraOpNumThreads(void* options, int n)'],
  SetInterOpNumThreads: [25, 'void* SetInterOpNumThreads(void* options, int n)'],
  CreateCustomOpDomain: [26, 'void* CreateCustomOpDomain(const char* domain, _Out_ void** out)'],
  CustomOpDomain_Add: [27, 'void* CustomOpDomain_Add(void* domain, void* op)'],
  AddCustomOpDomain: [28, 'void* AddCustomOpDomain(void* options, void* domain)'],
  SessionGetInputCount: [30, 'void* SessionGetInputCount(void* session, _Out_ size_t* out)'],
  SessionGetOutputCount: [31, 'void* SessionGetOutputCount(void* session, _Out_ size_t* out)'],
  SessionGetInputTypeInfo: [33, 'void* SessionGetInputTypeInfo(void* session, size_t index, _Out_ void** out)'],
  SessionGetOutputTypeInfo: [34, 'void* SessionGetOutputTypeInfo(void* session, size_t index, _Out_ void** out)'],
  SessionGetInputName: [36, 'void* SessionGetInputName(void* session, size_t index, void* allocator, _Out_ void** out)'],
  SessionGetOutputName: [37, 'void* SessionGetOutputName(void* session, size_t index, void* allocator, _Out_ void** out)'],
  CreateRunOptions: [39, 'void* CreateRunOptions(_Out_ void** out)'],
  RunOptionsSetRunLogSeverityLevel: [41, 'void* RunOptionsSetRunLogSeverityLevel(void* run_options, int level)'],
  RunOptionsSetTerminate: [46, 'void* RunOptionsSetTerminate(void* run_options)'],
  CreateTensorWithDataAsOrtValue: [49, 'void* CreateTensorWithDataAsOrtValue(void* mem_info, void* data, size_t data_length, const int64_t* shape, size_t shape_len, int type, _Out_ void** out)'],
  CreateTensorAsOrtValue: [48, 'void* CreateTensorAsOrtValue(void* allocator, const int64_t* shape, size_t shape_len, int type, _Out_ void** out)'],
  GetTensorMutableData: [51, 'void* GetTensorMutableData(void* value, _Out_ void** out)'],
  CastTypeInfoToTensorInfo: [55, 'void* CastTypeInfoToTensorInfo(void* type_info, _Out_ void** out)'],
  GetTensorElementType: [60, 'void* GetTensorElementType(void* info, _Out_ int* out)'],
  GetDimensionsCount: [61, 'void* GetDimensionsCount(void* info, _Out_ size_t* out)'],
  GetDimensions: [62, 'void* GetDimensions(void* info, void* dims, size_t dims_length)'],
  GetSymbolicDimensions: [63, 'void* GetSymbolicDimensions(void* info, void* dim_params, size_t dim_params_length)'],
  GetTensorTypeAndShape: [65, 'void* GetTensorTypeAndShape(void* value, _Out_ void** out)'],
  CreateMemoryInfo: [68, 'void* CreateMemoryInfo(const char* name, int allocator_type, int id, int mem_type, _Out_ void** out)'],
  CreateCpuMemoryInfo: [69, 'void* CreateCpuMemoryInfo(int allocator_type, int mem_type, _Out_ void** out)'],
  MemoryInfoGetName: [71, 'void* MemoryInfoGetName(void* info, _Out_ void** out)'],
  MemoryInfoGetId: [72, 'void* MemoryInfoGetId(void* info, _Out_ int* out)'],
  AllocatorAlloc: [75, 'void* AllocatorAlloc(void* allocator, size_t size, _Out_ void** out)'],
  AllocatorFree: [76, 'void* AllocatorFree(void* allocator, void* p)'],
  GetAllocatorWithDefaultOptions: [78, 'void* GetAllocatorWithDefaultOptions(_Out_ void** out)'],
  KernelContext_GetInputCount: [88, 'void* KernelContext_GetInputCount(void* context, _Out_ size_t* out)'],
  KernelContext_GetOutputCount: [89, 'void* KernelContext_GetOutputCount(void* context, _Out_ size_t* out)'],
  KernelContext_GetInput: [90, 'void* KernelContext_GetInput(void* context, size_t index, _Out_ void** out)'],
  KernelContext_GetOutput: [91, 'void* KernelContext_GetOutput(void* context, size_t index, const int64_t* dims, size_t dim_count, _Out_ void** out)'],
  ReleaseEnv: [92, 'void ReleaseEnv(void* p)'],
  ReleaseStatus: [93, 'void ReleaseStatus(void* p)'],
  ReleaseMemoryInfo: [94, 'void ReleaseMemoryInfo(void* p)'],
  ReleaseSession: [95, 'void ReleaseSession(void* p)'],
  ReleaseValue: [96, 'void ReleaseValue(void* p)'],
  ReleaseRunOptions: [97, 'void ReleaseRunOptions(void* p)'],
  ReleaseTypeInfo: [98, 'void ReleaseTypeInfo(void* p)'],
  ReleaseTensorTypeAndShapeInfo: [99, 'void ReleaseTensorTypeAndShapeInfo(void* p)'],
  ReleaseSessionOptions: [100, 'void ReleaseSessionOptions(void* p)'],
  ReleaseCustomOpDomain: [101, 'void ReleaseCustomOpDomain(void* p)'],
  SessionEndProfiling: [110, 'void* SessionEndProfiling(void* session, void* allocator, _Out_ void** out)'],
  GetAvailableProviders: [125, 'void* GetAvailableProviders(_Out_ void** out, _Out_ int* length)'],
  ReleaseAvailableProviders: [126, 'void* ReleaseAvailableProviders(void* ptr, int length)'],
  AddSessionConfigEntry: [130, 'void* AddSessionConfigEntry(void* options, const char* key, const char* value)'],
  CreateAllocator: [131, 'void* CreateAllocator(void* session, void* mem_info, _Out_ void** out)'],
  ReleaseAllocator: [132, 'void ReleaseAllocator(void* p)'],
  RunWithBinding: [133, 'void* RunWithBinding(void* session, void* run_options, void* binding)'],
  CreateIoBinding: [134, 'void* CreateIoBinding(void* session, _Out_ void** out)'],
  ReleaseIoBinding: [135, 'void ReleaseIoBinding(void* p)'],
  BindInput: [136, 'void* BindInput(void* binding, const char* name, void* value)'],
  BindOutput: [137, 'void* BindOutput(void* binding, const char* name, void* value)'],
  BindOutputToDevice: [138, 'void* BindOutputToDevice(void* binding, const char* name, void* mem_info)'],
  GetBoundOutputNames: [139, 'void* GetBoundOutputNames(void* binding, void* allocator, _Out_ void** buffer, _Out_ void** lengths, _Out_ size_t* count)'],
  GetBoundOutputValues: [140, 'void* GetBoundOutputValues(void* binding, void* allocator, _Out_ void** output, _Out_ size_t* count)'],
  ClearBoundInputs: [141, 'void ClearBoundInputs(void* binding)'],
  ClearBoundOutputs: [142, 'void ClearBoundOutputs(void* binding)'],
  CreateArenaCfgV2: [164, 'void* CreateArenaCfgV2(const char** keys, const size_t* values, size_t n, _Out_ void** out)'],
  ReleaseArenaCfg: [157, 'void ReleaseArenaCfg(void* p)'],
  AddRunConfigEntry: [165, 'void* AddRunConfigEntry(void* run_options, const char* key, const char* value)'],
  GetTensorMemoryInfo: [194, 'void* GetTensorMemoryInfo(void* value, _Out_ void** out)'],
  SynchronizeBoundInputs: [202, 'void* SynchronizeBoundInputs(void* binding)'],
  SynchronizeBoundOutputs: [203, 'void* SynchronizeBoundOutputs(void* binding)'],
  SessionOptionsAppendExecutionProvider_CUDA_V2: [204, 'void* SessionOptionsAppendExecutionProvider_CUDA_V2(void* options, void* cuda_options)'],
  CreateCUDAProviderOptions: [205, 'void* CreateCUDAProviderOptions(_Out_ void** out)'],
  UpdateCUDAProviderOptions: [206, 'void* UpdateCUDAProviderOptions(void* cuda_options, const char** keys, const char** values, size_t n)'],
  ReleaseCUDAProviderOptions: [208, 'void ReleaseCUDAProviderOptions(void* p)'],
  SessionOptionsAppendExecutionProvider: [216, 'void* SessionOptionsAppendExecutionProvider(void* options, const char* name, const char** keys, const char** values, size_t n)'],
  CreateAndRegisterAllocatorV2: [259, 'void* CreateAndRegisterAllocatorV2(void* env, const char* provider_type, void* mem_info, void* arena_cfg, const char** keys, const char** values, size_t n)'],
  GetKeyValuePairs: [298, 'void GetKeyValuePairs(void* kvps, _Out_ void** keys, _Out_ void** values, _Out_ size_t* n)'],
  ReleaseKeyValuePairs: [300, 'void ReleaseKeyValuePairs(void* p)'],
  AllocatorGetStats: [319, 'void* AllocatorGetStats(void* allocator, _Out_ void** out)'],
} as const;

type EntryName = keyof typeof entries;
// The native functions are typed loosely here and given precise types by the wrappers that use them.
type NativeFn = ((...args: unknown[]) => unknown) & { async: (...args: unknown[]) => void };

/**
 * A koffi type by name, declared on first use. koffi's type registry lives in its native module,
 * which a process loads once even when several module registries (jest's test files) load a
 * binding's file, so a declaration must tolerate finding its type already there.
 */
export function namedKoffiType(name: string, declare: () => koffi.TypeObject): koffi.TypeObject {
  try {
    return koffi.type(name);
  } catch {
    return declare();
  }
}

/** Where onnxruntime-node keeps `libonnxruntime.so.1` (the CUDA provider must sit beside it). */
export function ortLibraryDir(): string {
  if (process.env.LATHE_ORT_LIB_DIR) return process.env.LATHE_ORT_LIB_DIR;
  const require = createRequire(__filename);
  const pkg = dirname(require.resolve('onnxruntime-node/package.json'));
  const arch = process.arch === 'arm64' ? 'arm64' : 'x64';
  return join(pkg, 'bin', 'napi-v6', process.platform, arch);
}

/** Shared-library file name of ONNX Runtime on this platform. */
function ortLibraryName(): string {
  if (process.platform === 'win32') return 'onnxruntime.dll';
  if (process.platform === 'darwin') return 'libonnxruntime.1.dylib';
  return 'libonnxruntime.so.1';
}

/** The loaded C API: typed calls into the OrtApi table. */
export class CApi {
  private readonly fns = new Map<EntryName, NativeFn>();
  private readonly table: Ptr[];
  /** ORT's version string, e.g. "1.29.0". */
  readonly version: string;
  /** The library file loaded. */
  readonly libraryPath: string;
  /**
   * koffi's handle of the library. It must stay referenced for the life of the process: when koffi's
   * handle is garbage-collected it unloads the library, and every ORT function pointer dangles.
   */
  private readonly library: ReturnType<typeof koffi.load>;
  private readonly memcpy: (dst: Ptr, src: Ptr, n: number) => Ptr;
  private readonly memset: (dst: Ptr, value: number, n: number) => Ptr;

  private constructor() {
    const dir = ortLibraryDir();
    this.libraryPath = join(dir, ortLibraryName());
    if (!existsSync(this.libraryPath)) throw new Error(`ONNX Runtime library not found at ${this.libraryPath} (is onnxruntime-node installed?)`);
    const lib = (this.library = koffi.load(this.libraryPath));
    const libc = koffi.load(process.platform === 'darwin' ? 'libSystem.B.dylib' : process.platform === 'win32' ? 'msvcrt.dll' : 'libc.so.6');
    this.memcpy = libc.func('void* memcpy(void* dst, const void* src, size_t n)') as (dst: Ptr, src: Ptr, n: number) => Ptr;
    this.memset = libc.func('void* memset(void* dst, int value, size_t n)') as (dst: Ptr, value: number, n: number) => Ptr;
    const ApiBase = namedKoffiType('LatheOrtApiBase', () => koffi.struct('LatheOrtApiBase', { GetApi: 'void*', GetVersionString: 'void*' }));
    const base = koffi.decode(lib.func('void* OrtGetApiBase()')() as Ptr, ApiBase) as { GetApi: Ptr; GetVersionString: Ptr };
    this.version = (koffi.decode(base.GetVersionString, namedKoffiType('LatheOrtGetVersionString', () => koffi.proto('const char* LatheOrtGetVersionString()'))) as () => string)();
    const api = (koffi.decode(base.GetApi, namedKoffiType('LatheOrtGetApi', () => koffi.proto('void* LatheOrtGetApi(uint32_t version)'))) as (v: number) => Ptr | null)(ORT_API_VERSION);
    if (!api) throw new Error(`${this.libraryPath} (ONNX Runtime ${this.version}) does not provide C API version ${ORT_API_VERSION}; Lathe needs ONNX Runtime 1.29`);
    const maxIndex = Math.max(...Object.values(entries).map(([i]) => i));
    this.table = koffi.decode(api, 'void*', maxIndex + 1) as Ptr[];
  }

  private static instance: CApi | undefined;

  /** The process-wide C API (loaded on first use). */
  static get(): CApi {
    return (CApi.instance ??= new CApi());
  }

  /** The native function for an entry (declared once, cached). */
  fn(name: EntryName): NativeFn {
    let f = this.fns.get(name);
    if (!f) {
      const [index, signature] = entries[name];
      const protoName = `LatheOrt${name}`;
      const proto = namedKoffiType(protoName, () => koffi.proto(signature.replace(`${name}(`, `${protoName}(`)));
      f = koffi.decode(this.table[index], proto) as NativeFn;
      this.fns.set(name, f);
    }
    return f;
  }

  /** Throws an `OrtError` for a non-null status (and releases it). */
  check(fn: string, status: unknown): void {
    if (status === null || status === 0n || status === undefined) return;
    const s = status as Ptr;
    const code = this.fn('GetErrorCode')(s) as number;
    const message = this.fn('GetErrorMessage')(s) as string;
    this.fn('ReleaseStatus')(s);
    throw new OrtError(fn, ortErrorCodes[code] ?? `code ${code}`, message);
  }

  /** Calls a status-returning entry and checks the status. */
  call(name: EntryName, ...args: unknown[]): void {
    this.check(name, this.fn(name)(...args));
  }

  /** Calls a status-returning entry whose last parameter is a pointer output; returns it. */
  out(name: EntryName, ...args: unknown[]): Ptr {
    const o: (Ptr | null)[] = [null];
    this.check(name, this.fn(name)(...args, o));
    if (o[0] === null || o[0] === 0n) throw new OrtError(name, 'FAIL', 'returned a null pointer');
    return o[0];
  }

  /** Calls a status-returning entry whose last parameter is a numeric output; returns it. */
  outNumber(name: EntryName, ...args: unknown[]): number {
    const o: (number | bigint)[] = [0];
    this.check(name, this.fn(name)(...args, o));
    return Number(o[0]);
  }

  /** Calls a status-returning entry on a worker thread (for long runs that must not block the event loop). */
  async callAsync(name: EntryName, ...args: unknown[]): Promise<void> {
    const status = await new Promise<unknown>((resolve, reject) => {
      this.fn(name).async(...args, (err: unknown, res: unknown) => (err ? reject(err as Error) : resolve(res)));
    });
    this.check(name, status);
  }

  /** Reads a NUL-terminated C string. */
  string(p: Ptr): string {
    return koffi.decode(p, 'char', -1) as string;
  }

  /** Reads `n` C strings from an array of `char*`. */
  strings(p: Ptr, n: number): string[] {
    if (n === 0) return [];
    return (koffi.decode(p, 'void*', n) as Ptr[]).map((s) => this.string(s));
  }

  /** Reads `n` size_t values. */
  sizes(p: Ptr, n: number): number[] {
    if (n === 0) return [];
    return Array.from(koffi.decode(p, 'size_t', n) as ArrayLike<number | bigint>, Number);
  }

  /** Copies `n` bytes of native memory. */
  bytes(p: Ptr, n: number): Uint8Array {
    if (n === 0) return new Uint8Array(0);
    return Uint8Array.from(koffi.decode(p, 'uint8_t', n) as ArrayLike<number>);
  }

  /**
   * Copies host bytes into native memory, by memcpy between addresses: a `koffi.view` ArrayBuffer
   * over ORT-allocated memory keeps that memory from being reused (docs/runtime.md, "Choices").
   */
  copyIn(dst: Ptr, src: ArrayBufferView): void {
    if (src.byteLength > 0) this.memcpy(dst, koffi.address(src), src.byteLength);
  }

  /** Copies native memory into a host array (its whole byte length). */
  copyOut(dst: ArrayBufferView, src: Ptr): void {
    if (dst.byteLength > 0) this.memcpy(koffi.address(dst), src, dst.byteLength);
  }

  /** Sets `n` bytes of native memory to zero. */
  zero(dst: Ptr, n: number): void {
    if (n > 0) this.memset(dst, 0, n);
  }

  /** Copies `n` bytes between native addresses. */
  copy(dst: Ptr, src: Ptr, n: number): void {
    if (n > 0) this.memcpy(dst, src, n);
  }

  /** Reads a pointer-sized array of pointers. */
  pointers(p: Ptr, n: number): Ptr[] {
    if (n === 0) return [];
    return Array.from(koffi.decode(p, 'void*', n) as ArrayLike<Ptr>);
  }
}

/** A native library opened through koffi (by a package that binds one beside ONNX Runtime: NCCL, NVRTC, the CUDA driver). */
export type NativeLibrary = ReturnType<typeof koffi.load>;

/**
 * Opens the first of `candidates` (file paths or sonames for the dynamic loader) that loads and
 * exports the C function `probe`, which tells the library asked for from another with the same
 * name. Without one: every candidate's failure, for an error message that lists them.
 */
export function openNativeLibrary(candidates: readonly string[], probe: string): { lib: NativeLibrary; path: string } | { failures: string[] } {
  const failures: string[] = [];
  const firstLine = (e: unknown) => (e instanceof Error ? e.message : String(e)).split('\n')[0];
  for (const path of candidates) {
    let lib: NativeLibrary;
    try {
      lib = koffi.load(path);
    } catch (e) {
      failures.push(`${path}: ${firstLine(e)}`);
      continue;
    }
    try {
      lib.func(`int ${probe}(void* probe)`);
    } catch (e) {
      failures.push(`${path}: does not export ${probe} (${firstLine(e)})`);
      continue;
    }
    return { lib, path };
  }
  return { failures };
}
