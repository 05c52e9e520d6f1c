import type { CommandModule } from 'yargs';
import { demoCommand } from './demo';
import { sftCommand } from './sft';
import { gradeCommand } from './grade';
import { doctorCommand } from './doctor';
import { runsCommand } from './runs';
import { grpoCommand } from './grpo';
import { generateCommand } from './generate';
import { modelCommand } from './model';
import { rmCommand } from './rm';
import { dpoCommand } from './dpo';
import { evalCommand } from './eval';
import { serveCommand } from './serve';
import { quantizeCommand } from './quantize';
import { criticCommand } from './critic';
import { extractCommand } from './extract';
import { studioCommand } from './studio';
import { launchCommand } from './launch';

/** Every `lathe` subcommand; each lives in its own file beside this one. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- yargs command modules differ in their argv types
export const commands: CommandModule<any, any>[] = [
  demoCommand,
  sftCommand,
  grpoCommand,
  rmCommand,
  dpoCommand,
  generateCommand,
  serveCommand,
  evalCommand,
  gradeCommand,
  doctorCommand,
  runsCommand,
  modelCommand,
  quantizeCommand,
  studioCommand,
  launchCommand,
  criticCommand,
  extractCommand,
];
