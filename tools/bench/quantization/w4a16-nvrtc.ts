/**
 * Compiles Lathe's W4A16 source with NVRTC as `W4A16.compile` does on the device (no GPU needed: NVRTC
 * alone), for sm_90 by default, and prints ptxas' registers and spills per kernel from NVRTC's log and
 * whether every kernel the launcher loads (split-K and tiled) is in the cubin, with the tiled kernels' shared
 * memory — the check that what nvcc accepts
 * (tools/bench/kernels/ptxas.sh w4a16) NVRTC accepts too. `--module wgmma`: the wgmma module instead (sm_90a), with
 * ptxas' notes that it serialized wgmma (none is the goal). On the device: `node .bundle/w4a16-nvrtc.js`.
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/quantization/w4a16-nvrtc.ts [--nvrtc /path/libnvrtc.so.13] [--arch sm_90] [--module split|wgmma]
 *   (libnvrtc-builtins must be findable: LD_LIBRARY_PATH=<its folder>; the CUDA headers from cudaIncludeDir())
 */
import { cudaIncludeDir, Nvrtc, W4A16_TILE_VARIANTS, W4A16_TYPES, W4A16_VARIANTS, W4A16_WG_BUILDS, w4a16KernelName, w4a16Source, w4a16TileKernelName, w4a16TileSmem, w4a16WgKernelName, w4a16WgSource } from '@lathe/kernels';
import { arg } from '../argv';

const path = arg('nvrtc', '');
const nvrtc = Nvrtc.load(path ? [path] : undefined);
const wgmma = arg('module', 'split') === 'wgmma';
const arch = arg('arch', wgmma ? 'sm_90a' : 'sm_90');
const t0 = performance.now();
const image = nvrtc.compile(wgmma ? w4a16WgSource : w4a16Source, wgmma ? 'lathe_w4a16_wgmma' : 'lathe_w4a16', [`--gpu-architecture=${arch}`, `-I${cudaIncludeDir()}`, '--std=c++17', '--ptxas-options=-v']);
const text = Buffer.from(image.image).toString('latin1');
const dtypes = Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[];
// the cluster builds (ck > 1) are compiled in from sm_90 only, as the launcher loads them
const sm = Number(/\d+/.exec(arch)?.[0] ?? 0);
const tiles = W4A16_TILE_VARIANTS.filter((v) => v.ck === 1 || sm >= 90);
const kernels = wgmma
  ? dtypes.flatMap((d) => W4A16_WG_BUILDS.map((v) => w4a16WgKernelName(d, v)))
  : [...dtypes.flatMap((d) => W4A16_VARIANTS.map((v) => w4a16KernelName(d, v.mt, v.nt))), ...dtypes.flatMap((d) => tiles.map((v) => w4a16TileKernelName(d, v)))];
// the tiled kernels' dynamic shared memory (a launch past 48 KB opts in)
const tileSmem = Object.fromEntries(tiles.map((v) => [w4a16TileKernelName('bfloat16', v).replace('bf16_', ''), w4a16TileSmem(v)]));
const missing = kernels.filter((k) => !text.includes(k));
const perKernel = [...image.log.matchAll(/Compiling entry function '(\w+)'[\s\S]*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads[\s\S]*?Used (\d+) registers/g)].map((m) => ({ kernel: m[1], registers: +m[5], spill_stores: +m[3], spill_loads: +m[4], stack: +m[2] }));
// ptxas' performance notes (e.g. wgmma.mma_async serialized: each one waited for before the next)
const notes = [...new Set(image.log.split('\n').filter((l) => /Performance|serializ/i.test(l)))];
console.log(JSON.stringify({ nvrtc: nvrtc.version.join('.'), arch, kind: image.kind, bytes: image.image.length, compile_ms: Math.round(performance.now() - t0), kernels: kernels.length, missing, ...(wgmma ? {} : { tile_smem_bytes: tileSmem }), ptxas: perKernel, notes }));
if (missing.length) process.exit(1);
