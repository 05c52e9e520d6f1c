import yargs, { type Argv, type MiddlewareFunction } from 'yargs';
import { hideBin } from 'yargs/helpers';
import { commands } from './commands/index';
import { UsageError, nearest, suggestName } from './config-flags';

/** What the parser had reached when something failed: the command path and the options and subcommands it knew there. */
interface ParseContext {
  command: string[];
  options: string[];
  subcommands: string[];
}

/**
 * A yargs validation message as one line that names the flag and suggests what was meant: an
 * unknown option by edit distance over the command's real options (and their kebab-case and TRL
 * spellings), an unknown command over the commands, a value outside the choices over the choices.
 */
function usageMessage(msg: string, at: ParseContext, argv: readonly string[]): string {
  const unknown = /^Unknown arguments?: (.*)$/s.exec(msg);
  if (unknown) {
    const given = unknown[1].split(', ');
    const word = given.find((g) => argv.includes(g));
    if (word !== undefined && at.subcommands.length) {
      const hint = nearest(word, at.subcommands);
      return `unknown command '${word}'${hint ? ` (did you mean '${hint}'?)` : ''}`;
    }
    if (word !== undefined) return `unexpected argument '${word}'`;
    // yargs lists a kebab-case flag twice (as given and camelCased): report it as given
    const flag = given.find((g) => !given.includes(g.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)) || !/[A-Z]/.test(g)) ?? given[0];
    const hint = suggestName(flag, at.options);
    return `unknown option --${flag}${hint ? ` (did you mean --${hint}?)` : ''}`;
  }
  const invalid = /Argument: (.+?), Given: (.+?), Choices: (.+)$/m.exec(msg);
  if (invalid) {
    const given = String(JSON.parse(invalid[2]));
    const choices = (JSON.parse(`[${invalid[3]}]`) as unknown[]).map(String);
    const hint = nearest(given, choices);
    return `--${invalid[1]} must be one of ${choices.join(', ')}, got '${given}'${hint ? ` (did you mean '${hint}'?)` : ''}`;
  }
  const bare = /^Not enough arguments following: (.+)$/.exec(msg);
  if (bare) return `--${bare[1]} needs a value`;
  return msg.replace(/\s*\n\s*/g, '; ');
}

/** The parts of yargs' state the error messages read (a middleware's second argument in yargs 18; not in its typings). */
interface YargsState {
  getOptions(): { key: Record<string, unknown>; hiddenOptions: string[] };
  getInternalMethods(): { getContext(): { commands: unknown[] }; getCommandInstance(): { getCommands(): string[] } };
}

/** Records the command being parsed, with its visible options and subcommands, before yargs validates it. */
function recordContext(at: ParseContext): MiddlewareFunction {
  const record = (_argv: unknown, y: YargsState) => {
    const internal = y.getInternalMethods();
    const opts = y.getOptions();
    const hidden = new Set(opts.hiddenOptions);
    at.command = internal.getContext().commands.map(String);
    at.options = Object.keys(opts.key).filter((k) => !hidden.has(k));
    at.subcommands = internal.getCommandInstance().getCommands();
  };
  return record as unknown as MiddlewareFunction;
}

/** The `lathe` parser with every command; `at` is kept up to date with the command being parsed. */
function parser(argv: string[], at: ParseContext): Argv {
  let cli = yargs(argv)
    .scriptName('lathe')
    .locale('en')
    .strict()
    .demandCommand(1, `name a command: ${commands.map((c) => String(c.command).split(' ')[0]).join(', ')}`)
    .option('verbose', { type: 'boolean', global: true, describe: 'On an error, print its stack trace' })
    .epilogue(
      'Flags also take kebab-case (--run-dir for --run_dir) and the names TRL gives them (--learning_rate for --lr), in YAML configs too. ' +
        'Errors print one line (and the stack trace with --verbose); exit code 2 means a usage error, 1 a failure.',
    )
    .middleware(recordContext(at), true)
    .fail((msg, err) => {
      // yargs' own errors (YError: a flag without its value, …) are usage errors like its messages
      if (err && err.name !== 'YError') throw err;
      throw new UsageError(usageMessage(msg ?? err?.message ?? '', at, argv));
    })
    .help()
    .alias('h', 'help');
  for (const command of commands) cli = cli.command(command);
  return cli;
}

/** Prints an error as one line (`lathe <command>: <message>`) and a hint; the stack only with `--verbose`. Returns the exit code. */
export function reportError(err: unknown, at: ParseContext, verbose: boolean): number {
  const usage = err instanceof UsageError;
  const message = err instanceof Error ? err.message : String(err);
  const where = ['lathe', ...at.command].join(' ');
  process.stderr.write(`${where}: ${message}\n`);
  if (verbose && err instanceof Error && err.stack) process.stderr.write(`${err.stack}\n`);
  process.stderr.write(usage ? `Run '${where} --help' for usage.\n` : verbose ? '' : 'Run again with --verbose for the stack trace.\n');
  return usage ? 2 : 1;
}

/** Entry point of the `lathe` CLI. Returns the exit code of a failure (2: usage error, 1: runtime failure), or 0. */
export async function main(argv: string[]): Promise<number> {
  const at: ParseContext = { command: [], options: [], subcommands: commands.map((c) => String(c.command).split(' ')[0]) };
  try {
    await parser(argv, at).parseAsync();
    return 0;
  } catch (err) {
    return reportError(err, at, argv.includes('--verbose'));
  }
}

if (require.main === module) {
  main(hideBin(process.argv)).then((code) => {
    // a failure may leave handles open (workers, sessions): exit rather than wait for them
    if (code) process.exit(code);
  });
}
