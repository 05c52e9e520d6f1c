import yargs from 'yargs';
import { hideBin } from 'yargs/helpers';
import { commands } from './commands/index';

/** Entry point of the `lathe` CLI. */
export async function main(argv: string[]): Promise<void> {
  let cli = yargs(argv).scriptName('lathe').strict().demandCommand(1, 'name a command (see --help)').help().alias('h', 'help');
  for (const command of commands) cli = cli.command(command);
  await cli.parseAsync();
}

if (require.main === module) {
  main(hideBin(process.argv)).catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exit(1);
  });
}
