import type { CommandModule } from 'yargs';
import { diagnose, type DoctorCheck } from '@lathe/runtime';

/**
 * What the checks mean, one line each for the CPU and the GPU: a machine without a GPU is not a
 * failure, since training and generation of small models run on the CPU.
 */
export function doctorSummary(checks: DoctorCheck[]): { ready: boolean; lines: string[] } {
  const required = checks.filter((c) => !c.gpuOnly);
  const broken = required.find((c) => !c.ok);
  const cpu = broken
    ? `CPU: not ready — ${broken.name}: ${broken.detail}`
    : 'CPU: ready — training and generation of small models run on the CPU (--device cpu, the default); `lathe demo` runs here.';
  const gpuChecks = checks.filter((c) => c.gpuOnly);
  const gpus = gpuChecks.find((c) => c.name === 'GPUs');
  const gpuProblem = gpuChecks.find((c) => !c.ok);
  const gpu = !gpus?.ok
    ? 'GPU: none here. That is fine for CPU use; CUDA is needed only for GPU speed (larger models, faster steps): docs/runtime.md says how to set it up.'
    : gpuProblem
      ? `GPU: ${gpus.detail}, but CUDA does not work yet — ${gpuProblem.name}: ${gpuProblem.detail} (docs/runtime.md; the CPU still runs everything)`
      : gpuChecks.some((c) => c.name === 'CUDA device')
        ? 'GPU: ready (--device cuda).'
        : 'GPU: found; run without --no-cuda to check that a CUDA device opens.';
  return { ready: !broken, lines: [cpu, gpu] };
}

/** `lathe doctor`: what this machine offers ONNX Runtime, on the CPU and the GPU. */
export const doctorCommand: CommandModule<object, { json: boolean; cuda: boolean }> = {
  command: 'doctor',
  describe: 'Report Node, ONNX Runtime versions, execution providers, whether the CPU runs, and for GPU use the CUDA provider and libraries, GPUs, and whether a CUDA device opens',
  builder: (y) =>
    y
      .option('json', { type: 'boolean', default: false, describe: 'print the checks as one JSON line' })
      .option('cuda', { type: 'boolean', default: true, describe: 'try to open a CUDA device (--no-cuda to skip)' })
      .example('$0 doctor', 'check this machine')
      .example('$0 doctor --json --no-cuda', 'machine-readable, without touching the GPU'),
  handler: (argv) => {
    const checks = diagnose({ tryCuda: argv.cuda });
    const summary = doctorSummary(checks);
    if (argv.json) console.log(JSON.stringify(checks));
    else {
      const width = Math.max(...checks.map((c) => c.name.length));
      // a GPU-only check that fails is "--": missing for GPU use, not a fault of this machine
      for (const c of checks) console.log(`${c.ok ? 'ok  ' : c.gpuOnly ? '--  ' : 'FAIL'}  ${c.name.padEnd(width)}  ${c.detail}`);
      console.log('');
      for (const line of summary.lines) console.log(line);
    }
    if (!summary.ready) process.exitCode = 1;
  },
};
