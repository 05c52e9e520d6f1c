/**
 * Compiles Lathe's W4A16 source with NVRTC as `W4A16.compile` does on the device (no GPU needed: NVRTC
 * alone), for sm_90 by default, and prints ptxas' registers and spills per kernel from NVRTC's log and
 * whether every kernel the launcher loads (split-K and tiled) is in the cubin, with the tiled kernels' shared
 * memory — the check that what nvcc accepts
 * (tools/bench/kernels/ptxas.sh w4a16) NVRTC accepts too.
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/quantization/w4a16-nvrtc.ts [--nvrtc /path/libnvrtc.so.13] [--arch sm_90]
 *   (libnvrtc-builtins must be findable: LD_LIBRARY_PATH=<its folder>; the CUDA headers from cudaIncludeDir())
 */
import { cudaIncludeDir, Nvrtc, W4A16_TILE_VARIANTS, W4A16_TYPES, W4A16_VARIANTS, w4a16KernelName, w4a16Source, w4a16TileKernelName, w4a16TileSmem } from '@lathe/kernels';
import { arg } from '../argv';

const path = arg('nvrtc', '');
const nvrtc = Nvrtc.load(path ? [path] : undefined);
const arch = arg('arch', 'sm_90');
const t0 = performance.now();
const image = nvrtc.compile(w4a16Source, 'lathe_w4a16', [`--gpu-architecture=${arch}`, `-I${cudaIncludeDir()}`, '--std=c++17', '--ptxas-options=-v']);
const text = Buffer.from(image.image).toString('latin1');
const dtypes = Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[];
// the cluster builds (ck > 1) are compiled in from sm_90 only, as the launcher loads them
const sm = Number(/\d+/.exec(arch)?.[0] ?? 0);
const tiles = W4A16_TILE_VARIANTS.filter((v) => v.ck === 1 || sm >= 90);
const kernels = [...dtypes.flatMap((d) => W4A16_VARIANTS.map((v) => w4a16KernelName(d, v.mt, v.nt))), ...dtypes.flatMap((d) => tiles.map((v) => w4a16TileKernelName(d, v)))];
// the tiled kernels' dynamic shared memory (a launch past 48 KB opts in)
const tileSmem = Object.fromEntries(tiles.map((v) => [w4a16TileKernelName('bfloat16', v).replace('bf16_', ''), w4a16TileSmem(v)]));
const missing = kernels.filter((k) => !text.includes(k));
const perKernel = [...image.log.matchAll(/Compiling entry function '(\w+)'[\s\S]*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads[\s\S]*?Used (\d+) registers/g)].map((m) => ({ kernel: m[1], registers: +m[5], spill_stores: +m[3], spill_loads: +m[4], stack: +m[2] }));
console.log(JSON.stringify({ nvrtc: nvrtc.version.join('.'), arch, kind: image.kind, bytes: image.image.length, compile_ms: Math.round(performance.now() - t0), kernels: kernels.length, missing, tile_smem_bytes: tileSmem, ptxas: perKernel }));
if (missing.length) process.exit(1);
