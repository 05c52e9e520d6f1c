import type { CommandModule } from 'yargs';
import { gradeCommand } from './grade';

/** Every `lathe` subcommand; each lives in its own file beside this one. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- yargs command modules differ in their argv types
export const commands: CommandModule<any, any>[] = [gradeCommand];
