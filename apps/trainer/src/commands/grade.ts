import { accessSync, constants, createReadStream } from 'node:fs';
import type { Argv, CommandModule, Options } from 'yargs';
import { formatGradeSummary, gradeJsonl, gradeSchema, resolveGradeOptions } from '@lathe/graders';

/** One yargs flag per entry of the package's option schema (the single source of flags and defaults). */
function addGradeFlags<T>(y: Argv<T>): Argv<T> {
  let out = y;
  for (const [name, spec] of Object.entries(gradeSchema)) {
    const o: Options = { type: spec.type, describe: spec.describe, default: spec.default };
    if (spec.type === 'string') o.choices = [...spec.choices];
    out = out.option(name, o) as Argv<T>;
  }
  return out;
}

/** `lathe grade`: grades JSONL predictions against gold answers, one result line per input line. */
export const gradeCommand: CommandModule = {
  command: 'grade [file]',
  describe: 'Grade math answers: JSONL {"pred"|"response", "gold"} in (file or stdin), {"correct", "extracted"} lines out, a summary on stderr',
  builder: (y) =>
    addGradeFlags(y.positional('file', { type: 'string', describe: 'JSONL input (default: stdin; "-" also reads stdin)' }))
      .example('$0 grade preds.jsonl > verdicts.jsonl', 'grade a file')
      .example('$0 grade --format r1_zero < rollouts.jsonl', 'grade r1_zero responses from stdin'),
  handler: async (argv) => {
    const options = resolveGradeOptions(argv);
    const file = typeof argv.file === 'string' && argv.file !== '-' ? argv.file : null;
    if (file) {
      try {
        accessSync(file, constants.R_OK);
      } catch (e) {
        throw new Error(`${file}: cannot read the input (${(e as NodeJS.ErrnoException).code ?? String(e)})`);
      }
    }
    const input = file ? createReadStream(file) : process.stdin;
    const summary = await gradeJsonl(input, process.stdout, options, file ?? 'stdin');
    process.stderr.write(`${formatGradeSummary(summary)}\n`);
  },
};
