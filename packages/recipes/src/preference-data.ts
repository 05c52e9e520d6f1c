/**
 * Preference data for `lathe rm train`, `lathe rm eval` and `lathe dpo`: pairs read from a JSONL or
 * Parquet file (`@lathe/data`'s `loadPreferencePairs`: HH-RLHF transcripts, prompt/chosen/rejected
 * texts or conversational messages) or the built-in task's, thinking blocks stripped from the
 * responses, and tokenized the one way every preference command (and a reward model scoring GRPO
 * completions) encodes a prompt and a response. Pairs are never truncated: those over `max_length`
 * are skipped and counted, as are pairs whose responses are identical.
 */
import { existsSync } from 'node:fs';
import { loadPreferencePairs, type ChatTurn } from '@lathe/data';
import { seededRandom } from '@lathe/models';
import { selectPairs, type PreferencePair } from '@lathe/reward-models';
import { HfTokenizer } from '@lathe/tokenizer';
import { BUILTIN_DATA } from './demo-task';
import { splitHeldOut, type RunModel } from './scaffold';

/** One preference as text: `chosen` is preferred to `rejected` as the reply to the prompt. */
export interface PreferenceExample {
  /** The prompt's text as the file has it (an HH-RLHF transcript up to the open assistant turn, or a prompt). */
  prompt: string;
  /** The prompt as chat turns (what `--prompt_format chat` renders). */
  turns: ChatTurn[];
  chosen: string;
  rejected: string;
  /** How much more `chosen` is preferred (the row's `margin` field). */
  margin?: number;
  /** Where the pair comes from: `file:line`, `file row i`, or the built-in task's problem. */
  where: string;
}

/** What a preference file held. */
export interface PreferenceData {
  examples: PreferenceExample[];
  /** Rows skipped on reading because their response texts are identical. */
  identical: number;
}

/**
 * The built-in preference task: every problem of the demo task ("a+b=" with 0 ≤ a, b < 100), the
 * true sum preferred to a wrong one — the sum moved by 1 to 9 either way (never below 0), drawn
 * from a fixed seed, so the set is the same in every run.
 */
export function additionPreferences(): PreferenceExample[] {
  const random = seededRandom(0xadd);
  const out: PreferenceExample[] = [];
  for (let a = 0; a < 100; a++) {
    for (let b = 0; b < 100; b++) {
      const sum = a + b;
      let wrong = -1;
      while (wrong < 0) wrong = sum + (1 + Math.floor(random() * 9)) * (random() < 0.5 ? -1 : 1);
      const prompt = `${a}+${b}=`;
      out.push({ prompt, turns: [{ role: 'user', content: prompt }], chosen: String(sum), rejected: String(wrong), where: `${BUILTIN_DATA} problem ${prompt}` });
    }
  }
  return out;
}

/** The pairs of `--data`: a preference file, or {@link BUILTIN_DATA} ({@link additionPreferences}). */
export async function readPreferenceData(data: string): Promise<PreferenceData> {
  if (data === BUILTIN_DATA) return { examples: additionPreferences(), identical: 0 };
  if (!existsSync(data)) throw new Error(`--data ${data}: no such file`);
  const { examples, report } = await loadPreferencePairs(data);
  if (examples.length === 0) throw new Error(`--data ${data}: no preference pairs (${report.read} rows read, ${report.skipped.length} skipped: ${report.skipped[0]?.reason ?? 'none'})`);
  return { examples: examples.map((e) => ({ prompt: e.prompt, turns: e.turns, chosen: e.chosen, rejected: e.rejected, ...(e.margin !== undefined ? { margin: e.margin } : {}), where: e.where })), identical: report.skipped.length };
}

/**
 * A response without its thinking: every `<think>…</think>` block removed, and what precedes a
 * `</think>` whose opening tag was in the prompt (a chat template that opens the block itself);
 * an unclosed `<think>` drops the rest (a thought with no answer after it).
 */
export function stripThinking(text: string): string {
  let out = text;
  const close = out.indexOf('</think>');
  const open = out.indexOf('<think>');
  if (close >= 0 && (open < 0 || close < open)) out = out.slice(close + '</think>'.length);
  out = out.replace(/<think>[\s\S]*?<\/think>/g, '');
  const unclosed = out.indexOf('<think>');
  if (unclosed >= 0) out = out.slice(0, unclosed);
  return text === out ? text : out.replace(/^\s+/, '');
}

/** How a prompt and a response become ids; the same for training, evaluation and scoring GRPO completions. */
export interface PreferenceEncoder {
  /** The prompt's ids: BOS (when the tokenizer has one), then its text (`raw`) or its turns through the chat template with the assistant's turn opened (`chat`). */
  prompt(p: { prompt: string; turns: readonly ChatTurn[] }): number[];
  /** A response's ids: its text with thinking stripped (and trimmed in `chat` format), then EOS. */
  response(text: string): number[];
}

/** The prompt format options a preference command shares with `lathe sft` and `lathe grpo`. */
export interface PromptFormatOptions {
  prompt_format: 'raw' | 'chat';
  enable_thinking: boolean;
}

/**
 * The encoder of a loaded model's tokenizer. `chat` renders the turns with the tokenizer folder's
 * chat template (`loadRunModel` has already refused a chat format without one); earlier assistant
 * turns lose their thinking too.
 */
export async function preferenceEncoder(model: Pick<RunModel, 'tokenizer' | 'tokenizerFrom'>, cfg: PromptFormatOptions): Promise<PreferenceEncoder> {
  const tok = model.tokenizer;
  const bos = tok.bosId === undefined ? [] : [tok.bosId];
  const response = (text: string) => [...tok.encode(cfg.prompt_format === 'chat' ? stripThinking(text).trim() : stripThinking(text)), tok.eosId];
  if (cfg.prompt_format === 'raw') return { prompt: (p) => [...bos, ...tok.encode(p.prompt)], response };
  if (!model.tokenizerFrom) throw new Error('--prompt_format chat: the tokenizer has no chat template');
  const hf = await HfTokenizer.fromFolder(model.tokenizerFrom);
  return {
    prompt: (p) => {
      const turns = p.turns.map((t) => ({ role: t.role, content: t.role === 'assistant' ? stripThinking(t.content).trim() : t.content }));
      return [...bos, ...hf.encode(hf.applyChatTemplate(turns, { addGenerationPrompt: true, enableThinking: cfg.enable_thinking }))];
    },
    response,
  };
}

/** Tokenized pairs and what was left out. */
export interface TokenizedPreferences {
  /** The usable pairs, in input order. */
  pairs: PreferencePair[];
  /** The examples they come from (the same order). */
  examples: PreferenceExample[];
  /** Pairs left out: a row (prompt + response + EOS) longer than `max_length`, or identical responses once tokenized. */
  skipped: { overLength: number; identical: number };
}

/**
 * `examples` tokenized by `encoder` and selected (`selectPairs`): longer than `maxLength` or
 * identical once thinking is stripped — skipped and counted. With `margins`, every pair must carry
 * a margin (an error names the row). Nothing left is an error naming `--max_length` and `what`.
 */
export function tokenizePreferences(examples: readonly PreferenceExample[], encoder: PreferenceEncoder, opts: { maxLength: number; margins?: boolean; what: string }): TokenizedPreferences {
  const tokenized = examples.map((e): PreferencePair => {
    if (opts.margins && e.margin === undefined) throw new Error(`${e.where}: no 'margin' field (--margin reads one from every pair)`);
    return { prompt: encoder.prompt(e), chosen: encoder.response(e.chosen), rejected: encoder.response(e.rejected), ...(opts.margins ? { margin: e.margin } : {}) };
  });
  if (tokenized.length === 0) return { pairs: [], examples: [], skipped: { overLength: 0, identical: 0 } };
  let selection;
  try {
    selection = selectPairs(tokenized, { maxLength: opts.maxLength });
  } catch (e) {
    throw new Error(`--max_length ${opts.maxLength}: ${opts.what}: ${(e as Error).message}`);
  }
  return { pairs: selection.pairs, examples: selection.indices.map((i) => examples[i]), skipped: selection.skipped };
}

/** The options that say which pairs a preference run trains and holds out. */
export interface PreferenceSplitOptions extends PromptFormatOptions {
  data: string;
  eval_examples: number;
  seed: number;
  max_length: number;
}

/**
 * A preference run's pairs: `--data` read, the seeded held-out split made on the pairs as read (so
 * it does not depend on the tokenizer or `--max_length`), then each side tokenized and selected.
 * `skipped` adds up what was left out: pairs over max_length, identical responses (as read, or
 * once thinking is stripped and tokenized).
 */
export async function loadPreferenceSplit(cfg: PreferenceSplitOptions, model: Pick<RunModel, 'tokenizer' | 'tokenizerFrom'>, opts: { margins?: boolean } = {}) {
  const data = await readPreferenceData(cfg.data);
  const split = splitHeldOut(data.examples, cfg, 'pairs');
  const encoder = await preferenceEncoder(model, cfg);
  const train = tokenizePreferences(split.train, encoder, { maxLength: cfg.max_length, margins: opts.margins, what: `the training pairs of ${cfg.data}` });
  const held = tokenizePreferences(split.evaluation, encoder, { maxLength: cfg.max_length, margins: opts.margins, what: `the held-out pairs of ${cfg.data}` });
  const skipped = { overLength: train.skipped.overLength + held.skipped.overLength, identical: data.identical + train.skipped.identical + held.skipped.identical };
  return { train, held, skipped, encoder };
}
