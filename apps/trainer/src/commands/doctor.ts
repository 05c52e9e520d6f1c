import type { CommandModule } from 'yargs';
import { diagnose } from '@lathe/runtime';

/** `lathe doctor`: what this machine offers ONNX Runtime, and what is missing for the GPU. */
export const doctorCommand: CommandModule<object, { json: boolean; cuda: boolean }> = {
  command: 'doctor',
  describe: 'Report Node, ONNX Runtime versions, execution providers, CUDA provider and libraries, GPUs, and whether a CUDA device opens',
  builder: (y) =>
    y
      .option('json', { type: 'boolean', default: false, describe: 'print the checks as one JSON line' })
      .option('cuda', { type: 'boolean', default: true, describe: 'try to open a CUDA device (--no-cuda to skip)' })
      .example('$0 doctor', 'check this machine')
      .example('$0 doctor --json --no-cuda', 'machine-readable, without touching the GPU'),
  handler: (argv) => {
    const checks = diagnose({ tryCuda: argv.cuda });
    if (argv.json) {
      console.log(JSON.stringify(checks));
      return;
    }
    const width = Math.max(...checks.map((c) => c.name.length));
    for (const c of checks) console.log(`${c.ok ? 'ok  ' : 'FAIL'}  ${c.name.padEnd(width)}  ${c.detail}`);
  },
};
