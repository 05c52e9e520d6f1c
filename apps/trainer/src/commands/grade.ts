import { accessSync, constants, createReadStream } from 'node:fs';
import type { CommandModule } from 'yargs';
import { formatGradeSummary, gradeJsonl, gradeSchema } from '@lathe/graders';
import { addSchemaFlags, configFromArgv } from '../config-flags';

/** `lathe grade`: grades JSONL predictions against gold answers, one result line per input line. */
export const gradeCommand: CommandModule = {
  command: 'grade [file]',
  describe: 'Grade math answers: JSONL lines with a prediction ("pred", "response" or --pred_field) and a gold answer ("gold", "answer" or --gold_field) in (file or stdin), {"correct", "extracted"} lines out, a summary on stderr',
  builder: (y) =>
    addSchemaFlags(y.positional('file', { type: 'string', describe: 'JSONL input (default: stdin; "-" also reads stdin)' }), gradeSchema)
      .example('$0 grade preds.jsonl > verdicts.jsonl', 'grade a file')
      .example('$0 grade --format r1_zero < rollouts.jsonl', 'grade r1_zero responses from stdin')
      .example('$0 grade gsm8k-with-responses.jsonl', 'GSM8K rows with a "response" field: the gold is their "answer" ("#### n")'),
  handler: async (argv) => {
    const options = configFromArgv(gradeSchema, argv);
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
