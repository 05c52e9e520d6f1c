/**
 * What ptxas made of the W4A16 modules (CUDA, no launches): each kernel's registers, spill stores and loads, and
 * ptxas' warnings — for the wgmma module above all its "wgmma.mma_async instructions are serialized" notes, which
 * turn the asynchronous warpgroup MMA into one that waits for each instruction. Compiles with `--ptxas-options=-v`
 * (NVRTC's log carries ptxas' report for a cubin target). One JSON line a kernel, then the warnings.
 *
 * usage: node .bundle/w4a16-ptxas.js [--modules split,wgmma] [--split-depth 2|3|4]
 */
import { cudaIncludeDir, Kernels, w4a16Source, w4a16WgSource } from '@lathe/kernels';
import { arg } from '../argv';

/** ptxas' `-v` report per function: `Compiling entry function 'X'`, then `Used N registers`, then spill lines. */
function report(log: string): { kernel: string; registers?: number; spill_stores?: number; spill_loads?: number; stack?: number }[] {
  const out: { kernel: string; registers?: number; spill_stores?: number; spill_loads?: number; stack?: number }[] = [];
  for (const line of log.split('\n')) {
    const entry = /Compiling entry function '([^']+)'/.exec(line);
    if (entry) out.push({ kernel: entry[1]! });
    const cur = out[out.length - 1];
    if (!cur) continue;
    const spill = /(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads/.exec(line);
    if (spill) Object.assign(cur, { stack: +spill[1]!, spill_stores: +spill[2]!, spill_loads: +spill[3]! });
    const regs = /Used (\d+) registers/.exec(line);
    if (regs) cur.registers = +regs[1]!;
  }
  return out;
}

function main(): void {
  const modules = arg('modules', 'split,wgmma').split(',');
  const depth = arg('split-depth', '');
  const { kernels } = Kernels.withDevice();
  const include = `-I${cudaIncludeDir()}`;
  const jobs: { name: string; source: string; target: string; options: string[] }[] = [];
  if (modules.includes('split')) jobs.push({ name: 'lathe_w4a16', source: w4a16Source, target: `sm_${kernels.arch}`, options: depth ? [`-DW4A16_SPLIT_DEPTH=${depth}`] : [] });
  if (modules.includes('wgmma')) jobs.push({ name: 'lathe_w4a16_wgmma', source: w4a16WgSource, target: 'sm_90a', options: [] });
  for (const j of jobs) {
    const image = kernels.nvrtc.compile(j.source, j.name, [`--gpu-architecture=${j.target}`, include, '--std=c++17', '--ptxas-options=-v', ...j.options]);
    for (const r of report(image.log)) if (j.name !== 'lathe_w4a16' || !r.kernel.includes('_tile_')) console.log(JSON.stringify({ module: j.name, ...r }));
    const warnings = image.log.split('\n').filter((l) => /warning|Performance|serializ/i.test(l));
    console.log(JSON.stringify({ module: j.name, warnings: [...new Set(warnings)].slice(0, 20) }));
  }
}

main();
