/**
 * NVRTC, CUDA's run-time compiler, through koffi: CUDA C++ source in, a cubin (for an `sm_XY`
 * target) or PTX (for a `compute_XY` target, which the driver compiles at load) out.
 */
import { loadLibrary, type Library } from './library';

/** A failed NVRTC call or compilation; for a compilation, `log` holds NVRTC's messages. */
export class NvrtcError extends Error {
  constructor(
    message: string,
    /** NVRTC's program log (compile errors with line numbers), when there is one. */
    readonly log = '',
  ) {
    super(message);
    this.name = 'NvrtcError';
  }
}

/** What a compilation produced. */
export interface CompiledImage {
  /** `cubin` for an `sm_XY` target, `ptx` for `compute_XY`. */
  kind: 'cubin' | 'ptx';
  /** The image bytes (PTX is NUL-terminated text, as the driver wants it). */
  image: Uint8Array;
  /** NVRTC's log (warnings; empty when clean). */
  log: string;
}

type Fn = (...args: unknown[]) => number;

/** The loaded NVRTC library. */
export class Nvrtc {
  /** NVRTC's version, e.g. [13, 0]. */
  readonly version: [number, number];
  private readonly f: Record<string, Fn>;
  private readonly errorString: (code: number) => string;

  constructor(
    private readonly lib: Library,
    /** The library file loaded. */
    readonly path: string,
  ) {
    const decl = (sig: string) => this.lib.func(sig) as Fn;
    this.f = {
      version: decl('int nvrtcVersion(_Out_ int* major, _Out_ int* minor)'),
      create: decl('int nvrtcCreateProgram(_Out_ void** prog, const char* src, const char* name, int numHeaders, void* headers, void* includeNames)'),
      compile: decl('int nvrtcCompileProgram(void* prog, int numOptions, const char** options)'),
      logSize: decl('int nvrtcGetProgramLogSize(void* prog, _Out_ size_t* size)'),
      log: decl('int nvrtcGetProgramLog(void* prog, void* log)'),
      ptxSize: decl('int nvrtcGetPTXSize(void* prog, _Out_ size_t* size)'),
      ptx: decl('int nvrtcGetPTX(void* prog, void* ptx)'),
      cubinSize: decl('int nvrtcGetCUBINSize(void* prog, _Out_ size_t* size)'),
      cubin: decl('int nvrtcGetCUBIN(void* prog, void* cubin)'),
      destroy: decl('int nvrtcDestroyProgram(_Inout_ void** prog)'),
      numArchs: decl('int nvrtcGetNumSupportedArchs(_Out_ int* n)'),
      archs: decl('int nvrtcGetSupportedArchs(void* archs)'),
    };
    this.errorString = this.lib.func('const char* nvrtcGetErrorString(int result)') as (code: number) => string;
    const major = [0];
    const minor = [0];
    this.check('nvrtcVersion', this.f.version(major, minor));
    this.version = [major[0], minor[0]];
  }

  /** Loads NVRTC from the usual places (see `libraryCandidates`), or throws a `KernelLibraryError`. */
  static load(candidates?: string[]): Nvrtc {
    const { lib, path } = loadLibrary('nvrtc', candidates);
    return new Nvrtc(lib, path);
  }

  private check(fn: string, code: number, log = ''): void {
    if (code !== 0) throw new NvrtcError(`${fn}: ${this.errorString(code)} (nvrtcResult ${code})${log ? `\n${log}` : ''}`, log);
  }

  /** The SM architectures this NVRTC can emit code for, e.g. [75, 80, 86, 89, 90, 100, 120]. */
  supportedArchs(): number[] {
    const n = [0];
    this.check('nvrtcGetNumSupportedArchs', this.f.numArchs(n));
    const out = new Int32Array(n[0]);
    this.check('nvrtcGetSupportedArchs', this.f.archs(out));
    return Array.from(out);
  }

  /**
   * Compiles `source` (named `name` in messages) with NVRTC `options` (which must include a
   * `--gpu-architecture`). A compile error throws an `NvrtcError` carrying NVRTC's log.
   */
  compile(source: string, name: string, options: string[]): CompiledImage {
    const prog: (bigint | null)[] = [null];
    this.check('nvrtcCreateProgram', this.f.create(prog, source, name, 0, null, null));
    try {
      const status = this.f.compile(prog[0], options.length, options);
      const log = this.programLog(prog[0]!);
      if (status !== 0) throw new NvrtcError(`compiling kernel source '${name}' failed (${this.errorString(status)}), NVRTC ${this.version.join('.')} with ${options.join(' ')}:\n${log}`, log);
      const kind = options.some((o) => /^(--gpu-architecture|-arch)[= ]?sm_/.test(o)) ? 'cubin' : 'ptx';
      const size = [0];
      this.check(kind === 'cubin' ? 'nvrtcGetCUBINSize' : 'nvrtcGetPTXSize', (kind === 'cubin' ? this.f.cubinSize : this.f.ptxSize)(prog[0], size));
      const image = new Uint8Array(Number(size[0]));
      this.check(kind === 'cubin' ? 'nvrtcGetCUBIN' : 'nvrtcGetPTX', (kind === 'cubin' ? this.f.cubin : this.f.ptx)(prog[0], image));
      return { kind, image, log };
    } finally {
      this.f.destroy(prog);
    }
  }

  private programLog(prog: bigint): string {
    const size = [0];
    this.check('nvrtcGetProgramLogSize', this.f.logSize(prog, size));
    const n = Number(size[0]);
    if (n <= 1) return '';
    const buf = Buffer.alloc(n);
    this.check('nvrtcGetProgramLog', this.f.log(prog, buf));
    return buf.toString('utf8', 0, n - 1).trim();
  }
}
