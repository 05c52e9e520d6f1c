import type { CommandModule } from 'yargs';
import { DEMO_SFT_OVERRIDES, sftSchema } from '@lathe/train';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { sftMain } from './sft';

/** `lathe demo`: the quick start's job — `lathe sft` on the built-in model and task, in runs/demo. */
export const demoCommand: CommandModule = {
  command: 'demo',
  describe: 'SFT of a tiny random Qwen3 on synthetic two-digit addition, on the CPU with no downloads; prints held-out accuracy before and after',
  builder: (y) => addSchemaFlags(y, sftSchema).epilogue(`Demo settings (flags override them): ${JSON.stringify(DEMO_SFT_OVERRIDES)}`),
  handler: async (argv) => sftMain(configFromArgv(sftSchema, argv, { name: 'demo settings', values: { ...DEMO_SFT_OVERRIDES } })),
};
