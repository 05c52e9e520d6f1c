/**
 * Dataset loaders: MATH (problem form and the SFT `{prompt, response}` form), GSM8K, preference pairs
 * (HH-RLHF transcripts split into a shared prompt and two responses) and plain prompt sets for RL.
 * Each reads JSONL, JSONL.gz or Parquet (by content), returns typed examples and a report of what it
 * skipped and why; errors name the file, the row and the field.
 */
import { leadingBytes } from './files';
import { readJsonl } from './jsonl';
import { readParquet } from './parquet';

/** One raw record and where it came from (`file:line` for JSONL, `file row i` for Parquet). */
export interface SourceRecord {
  value: Record<string, unknown>;
  where: string;
  /** 0-based index in the file. */
  index: number;
}

function isParquet(file: string): boolean {
  return leadingBytes(file, 4).toString('latin1') === 'PAR1';
}

const plain = (v: unknown): unknown => {
  if (typeof v === 'bigint') return Number(v);
  if (v !== null && typeof v === 'object' && 'toArray' in v && typeof (v as { toArray: unknown }).toArray === 'function') {
    return Array.from((v as { toArray(): ArrayLike<unknown> }).toArray(), plain);
  }
  return v;
};

/** The records of a JSONL(.gz) or Parquet file as plain objects. */
export async function readRecords(file: string): Promise<SourceRecord[]> {
  const out: SourceRecord[] = [];
  if (isParquet(file)) {
    const t = await readParquet(file);
    const names = t.schema.fields.map((f) => f.name);
    const cols = names.map((n) => t.getChild(n)!);
    for (let i = 0; i < t.numRows; i++) {
      out.push({ value: Object.fromEntries(names.map((n, k) => [n, plain(cols[k].get(i))])), where: `${file} row ${i}`, index: i });
    }
    return out;
  }
  for await (const r of readJsonl(file)) out.push({ value: r.value, where: `${file}:${r.line}`, index: out.length });
  return out;
}

function str(r: SourceRecord, field: string, opts: { optional?: boolean } = {}): string | undefined {
  const v = r.value[field];
  if (typeof v === 'string') return v;
  if (typeof v === 'number') return String(v);
  if ((v === undefined || v === null) && opts.optional) return undefined;
  throw new Error(`${r.where}: field '${field}' ${v === undefined ? 'is missing' : `is ${JSON.stringify(v)}, expected a string`}`);
}

/** What a loader skipped. */
export interface LoadReport {
  file: string;
  /** Records read. */
  read: number;
  /** Examples returned. */
  loaded: number;
  /** Records left out, each with where it is and why. */
  skipped: { where: string; reason: string }[];
}

/** What a loader's per-record function returns for a record it leaves out: the reason, for the report. */
class Skip {
  constructor(readonly reason: string) {}
}

/** Reads a file's records and makes each an example, or a {@link Skip} that the report lists with where it is. */
async function loadExamples<T>(file: string, example: (r: SourceRecord) => T | Skip): Promise<{ examples: T[]; report: LoadReport }> {
  const records = await readRecords(file);
  const examples: T[] = [];
  const skipped: LoadReport['skipped'] = [];
  for (const r of records) {
    const ex = example(r);
    if (ex instanceof Skip) skipped.push({ where: r.where, reason: ex.reason });
    else examples.push(ex);
  }
  return { examples, report: { file, read: records.length, loaded: examples.length, skipped } };
}

/** A MATH problem. */
export interface MathExample {
  id: string;
  problem: string;
  /** Worked solution (absent in some evaluation sets). */
  solution?: string;
  /** Final answer: the `answer` field, or the last `\boxed{…}` of the solution. */
  answer: string;
  subject?: string;
  level?: number;
}

/** The content of the last `\boxed{…}` (or `\fbox{…}`) in a text, or null. */
export function lastBoxed(text: string): string | null {
  const at = Math.max(text.lastIndexOf('\\boxed'), text.lastIndexOf('\\fbox'));
  if (at < 0) return null;
  const open = text.indexOf('{', at);
  if (open < 0) return null;
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(open + 1, i);
  }
  return null;
}

/**
 * MATH rows `{problem, solution, answer, subject, level}` (MATH-500, or the original MATH without
 * `answer`, whose answer is then the solution's last `\boxed{}`; `type` is read as the subject and
 * "Level 3" as 3). Rows without an answer are skipped and reported.
 */
export async function loadMath(file: string): Promise<{ examples: MathExample[]; report: LoadReport }> {
  return loadExamples(file, (r) => {
    const problem = str(r, 'problem')!;
    const solution = str(r, 'solution', { optional: true });
    const answer = str(r, 'answer', { optional: true }) ?? (solution !== undefined ? lastBoxed(solution) : null);
    if (answer === null || answer === undefined) return new Skip("no 'answer' field and no \\boxed{} in the solution");
    const subject = str(r, 'subject', { optional: true }) ?? str(r, 'type', { optional: true });
    const levelRaw = r.value.level;
    const level = typeof levelRaw === 'number' ? levelRaw : typeof levelRaw === 'string' ? Number(/\d+/.exec(levelRaw)?.[0]) : undefined;
    const ex: MathExample = { id: str(r, 'unique_id', { optional: true }) ?? str(r, 'id', { optional: true }) ?? String(r.index), problem, answer };
    if (solution !== undefined) ex.solution = solution;
    if (subject !== undefined) ex.subject = subject;
    if (level !== undefined && Number.isFinite(level)) ex.level = level;
    return ex;
  });
}

/** A supervised pair. Extra string fields of the record (e.g. `subject`, `answer`) are kept in `meta`. */
export interface SftPair {
  prompt: string;
  response: string;
  meta?: Record<string, string>;
}

/** SFT rows `{prompt, response}` (the form `lathe sft` trains on). */
export async function loadSftPairs(file: string): Promise<{ examples: SftPair[]; report: LoadReport }> {
  return loadExamples(file, (r) => {
    const pair: SftPair = { prompt: str(r, 'prompt')!, response: str(r, 'response')! };
    const meta = Object.fromEntries(Object.entries(r.value).filter(([k, v]) => k !== 'prompt' && k !== 'response' && typeof v === 'string') as [string, string][]);
    if (Object.keys(meta).length) pair.meta = meta;
    return pair;
  });
}

/**
 * MATH problems as SFT pairs: the prompt from a template (`{question}` is replaced by the problem)
 * and the response from a function of the example (default: the solution).
 */
export function mathToSft(examples: readonly MathExample[], options: { template: string; response?: (e: MathExample) => string }): SftPair[] {
  if (!options.template.includes('{question}')) throw new Error(`mathToSft: the template has no {question} placeholder`);
  return examples.map((e) => {
    const response = options.response ? options.response(e) : e.solution;
    if (response === undefined) throw new Error(`mathToSft: example '${e.id}' has no solution (pass options.response)`);
    const meta: Record<string, string> = { answer: e.answer };
    if (e.subject) meta.subject = e.subject;
    return { prompt: options.template.split('{question}').join(e.problem), response, meta };
  });
}

/** A GSM8K problem. */
export interface Gsm8kExample {
  id: string;
  question: string;
  /** The worked solution with `<<…>>` calculator notes and the final `#### n` line. */
  solution: string;
  /** The number after `#### `, thousands separators removed. */
  answer: string;
}

/** GSM8K rows `{question, answer}` (answer: a worked solution ending in `#### n`). */
export async function loadGsm8k(file: string): Promise<{ examples: Gsm8kExample[]; report: LoadReport }> {
  return loadExamples(file, (r) => {
    const solution = str(r, 'answer')!;
    const m = /####\s*(.+?)\s*$/.exec(solution);
    if (!m) return new Skip("field 'answer' has no '#### n' line");
    return { id: String(r.index), question: str(r, 'question')!, solution, answer: m[1].replace(/,/g, '') };
  });
}

/** One turn of a conversation, as chat templates take it. */
export interface ChatTurn {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** A preference pair: a shared prompt (the conversation so far) and two final responses. */
export interface PreferencePair {
  id: string;
  /**
   * The prompt as the file has it: an HH-RLHF transcript up to and including the last
   * `\n\nAssistant:` both share, a `prompt` field's text, or (conversational rows) the shared
   * messages rendered as such a transcript.
   */
  prompt: string;
  chosen: string;
  rejected: string;
  /** The prompt as chat turns: a transcript's Human/Assistant turns, a row's messages, or one user turn. */
  turns: ChatTurn[];
  /** The row's `margin` field (how much more `chosen` is preferred), when it has one. */
  margin?: number;
  /** Where the row is: `file:line` (JSONL) or `file row i` (Parquet). */
  where: string;
}

const ASSISTANT = '\n\nAssistant:';
const HUMAN = '\n\nHuman:';

/**
 * Splits two HH-RLHF transcripts ("\n\nHuman: …\n\nAssistant: …") into the shared prompt, up to
 * and including the last `\n\nAssistant:` that begins the same turn in both, and the two responses.
 * Returns null when they share no assistant turn.
 */
export function splitPreference(chosen: string, rejected: string): { prompt: string; chosen: string; rejected: string } | null {
  let common = 0;
  const n = Math.min(chosen.length, rejected.length);
  while (common < n && chosen.charCodeAt(common) === rejected.charCodeAt(common)) common++;
  // The last assistant turn that starts inside the common prefix (its marker wholly shared).
  const at = chosen.lastIndexOf(ASSISTANT, common - ASSISTANT.length);
  if (at < 0) return null;
  const cut = at + ASSISTANT.length;
  return { prompt: chosen.slice(0, cut), chosen: chosen.slice(cut), rejected: rejected.slice(cut) };
}

/**
 * An HH-RLHF prompt ("\n\nHuman: …\n\nAssistant: …\n\nHuman: …\n\nAssistant:") as chat turns,
 * Human → user and Assistant → assistant, each turn's text trimmed; the final, open assistant turn
 * is left out. Null when the text is not such a transcript: it must begin with `\n\nHuman:` and
 * end with `\n\nAssistant:`. Two turns of one role in a row (a few HH-RLHF rows have them) are
 * kept as they are.
 */
export function parseTranscript(prompt: string): ChatTurn[] | null {
  if (!prompt.startsWith(HUMAN) || !prompt.endsWith(ASSISTANT)) return null;
  const parts = prompt.slice(0, -ASSISTANT.length).split(/\n\n(Human|Assistant):/);
  // parts: ['', 'Human', text, 'Assistant', text, …]
  const turns: ChatTurn[] = [];
  for (let i = 1; i < parts.length; i += 2) turns.push({ role: parts[i] === 'Human' ? 'user' : 'assistant', content: parts[i + 1].trim() });
  return turns;
}

/** Chat turns back as an HH-RLHF prompt ending with the open assistant turn (what {@link parseTranscript} reads). */
export function transcriptOf(turns: readonly ChatTurn[]): string {
  return turns.map((t) => `${t.role === 'assistant' ? ASSISTANT : t.role === 'system' ? '\n\nSystem:' : HUMAN} ${t.content}`).join('') + ASSISTANT;
}

const ROLES = new Set(['system', 'user', 'assistant']);

/** A field holding a list of `{role, content}` messages, checked; null when the field is not a list. */
function messages(r: SourceRecord, field: string): ChatTurn[] | null {
  const v = r.value[field];
  if (!Array.isArray(v)) return null;
  return v.map((m, i) => {
    const o = (m ?? {}) as Record<string, unknown>;
    if (typeof o.role !== 'string' || !ROLES.has(o.role) || typeof o.content !== 'string') {
      throw new Error(`${r.where}: field '${field}' message ${i} is ${JSON.stringify(m)}, expected {"role": "system" | "user" | "assistant", "content": string}`);
    }
    return { role: o.role as ChatTurn['role'], content: o.content };
  });
}

/** The one assistant reply a response field holds: a string, or a list ending in one assistant message. */
function reply(r: SourceRecord, field: string, list: ChatTurn[] | null): string {
  if (list === null) return str(r, field)!;
  const last = list.at(-1);
  if (!last || last.role !== 'assistant') throw new Error(`${r.where}: field '${field}' must end with an assistant message`);
  return last.content;
}

/** Whether two turn lists are equal. */
const sameTurns = (a: readonly ChatTurn[], b: readonly ChatTurn[]) => a.length === b.length && a.every((t, i) => t.role === b[i].role && t.content === b[i].content);

/**
 * One row as a pair, or a {@link Skip}; an error names the row for a missing field or a prompt
 * that cannot be read as a conversation.
 */
function preferenceRow(r: SourceRecord): PreferencePair | Skip {
  const chosenList = messages(r, 'chosen');
  const rejectedList = messages(r, 'rejected');
  const promptList = messages(r, 'prompt');
  let prompt: string;
  let turns: ChatTurn[];
  let chosen: string;
  let rejected: string;
  if (chosenList || rejectedList || promptList) {
    // conversational rows (TRL's format): messages, with the prompt given or the shared leading ones
    chosen = reply(r, 'chosen', chosenList);
    rejected = reply(r, 'rejected', rejectedList);
    if (promptList) turns = promptList;
    else if (chosenList && rejectedList) {
      turns = chosenList.slice(0, -1);
      if (!sameTurns(turns, rejectedList.slice(0, -1))) throw new Error(`${r.where}: the 'chosen' and 'rejected' conversations differ before their last message (give the shared part as 'prompt')`);
    } else {
      const given = str(r, 'prompt')!;
      turns = parseTranscript(given) ?? [{ role: 'user', content: given }];
    }
    if (turns.length === 0) throw new Error(`${r.where}: no prompt messages before the responses`);
    prompt = transcriptOf(turns);
  } else {
    chosen = str(r, 'chosen')!;
    rejected = str(r, 'rejected')!;
    const given = str(r, 'prompt', { optional: true });
    if (given !== undefined) {
      prompt = given;
      // a prompt written as a transcript is read as one; any other text is one user turn
      turns = given.startsWith(HUMAN) ? parseTranscript(given) ?? badTranscript(r, 'prompt', given) : [{ role: 'user', content: given }];
    } else {
      const split = splitPreference(chosen, rejected);
      if (!split) throw new Error(`${r.where}: the 'chosen' and 'rejected' transcripts share no "${ASSISTANT.trim()}" turn (expected HH-RLHF transcripts "\\n\\nHuman: …\\n\\nAssistant: …", or a 'prompt' field)`);
      ({ prompt, chosen, rejected } = split);
      turns = parseTranscript(prompt) ?? badTranscript(r, 'chosen', prompt);
    }
  }
  const m = r.value.margin;
  if (m !== undefined && m !== null && (typeof m !== 'number' || !Number.isFinite(m))) throw new Error(`${r.where}: field 'margin' is ${JSON.stringify(m)}, expected a finite number`);
  if (chosen === rejected) return new Skip('chosen and rejected responses are identical');
  return { id: String(r.index), prompt, chosen, rejected, turns, ...(typeof m === 'number' ? { margin: m } : {}), where: r.where };
}

function badTranscript(r: SourceRecord, field: string, prompt: string): never {
  const head = prompt.length > 60 ? `${prompt.slice(0, 60)}…` : prompt;
  throw new Error(`${r.where}: cannot read field '${field}' as an HH-RLHF transcript (it must begin with "\\n\\nHuman:" and its prompt end with "\\n\\nAssistant:"); it begins ${JSON.stringify(head)}`);
}

/**
 * Preference pairs, in any of the forms preference data comes in: HH-RLHF rows `{chosen,
 * rejected}` (whole transcripts, split by {@link splitPreference} and read as turns by
 * {@link parseTranscript}); rows with `{prompt, chosen, rejected}` texts (a prompt that is a
 * transcript is read as one, any other as one user turn); or TRL's conversational rows, whose
 * fields are lists of `{role, content}` messages (the prompt given, or the messages both
 * conversations share). An optional numeric `margin` is kept. A missing field, a transcript that
 * cannot be read or conversations that differ before their replies are errors naming the file and
 * row; pairs whose responses are identical are skipped and reported.
 */
export async function loadPreferencePairs(file: string): Promise<{ examples: PreferencePair[]; report: LoadReport }> {
  return loadExamples(file, preferenceRow);
}

/** A prompt for RL, with its reference answer when the set has one and the record's other fields. */
export interface PromptExample {
  id: string;
  prompt: string;
  answer?: string;
  meta: Record<string, unknown>;
}

/**
 * Plain prompt sets for RL: `{prompt}` rows (the field name is an option, e.g. `problem` or
 * `question`), with an optional answer field (default `answer`).
 */
export async function loadPrompts(file: string, options: { field?: string; answerField?: string } = {}): Promise<{ examples: PromptExample[]; report: LoadReport }> {
  const field = options.field ?? 'prompt';
  const answerField = options.answerField ?? 'answer';
  return loadExamples(file, (r) => {
    const { [field]: _p, [answerField]: _a, ...meta } = r.value;
    const ex: PromptExample = { id: String(r.index), prompt: str(r, field)!, meta };
    const answer = str(r, answerField, { optional: true });
    if (answer !== undefined) ex.answer = answer;
    return ex;
  });
}

/** A message of a conversation (TRL's conversational format). */
export interface ConversationMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
}

/** A conversation for SFT. Extra string fields of the record (e.g. `subject`) are kept in `meta`. */
export interface Conversation {
  messages: ConversationMessage[];
  /** Where the record is (`file:line` or `file row i`), for errors found later (e.g. by a chat template). */
  where: string;
  meta?: Record<string, string>;
}

const CONVERSATION_ROLES: readonly string[] = ['system', 'user', 'assistant', 'tool'];

/**
 * Conversations `{messages: [{role, content}, …]}` (TRL's conversational format; JSONL or Parquet
 * with a list-of-struct column). Every message needs a `role` (system, user, assistant or tool)
 * and a string `content`, and each conversation an assistant message to learn; a record that breaks
 * this is an error naming the file, the row and the message.
 */
export async function loadConversations(file: string): Promise<{ examples: Conversation[]; report: LoadReport }> {
  return loadExamples(file, (r) => {
    const raw = r.value.messages;
    if (!Array.isArray(raw)) throw new Error(`${r.where}: field 'messages' ${raw === undefined ? 'is missing' : `is ${JSON.stringify(raw)?.slice(0, 80)}, expected a list of {role, content}`}`);
    if (raw.length === 0) throw new Error(`${r.where}: field 'messages' is empty`);
    const messages = raw.map((m: unknown, i): ConversationMessage => {
      const at = `${r.where}: messages[${i}]`;
      if (m === null || typeof m !== 'object' || Array.isArray(m)) throw new Error(`${at} is ${JSON.stringify(m)}, expected {role, content}`);
      const { role, content } = m as Record<string, unknown>;
      if (role === undefined || role === null) throw new Error(`${at}: field 'role' is missing`);
      if (typeof role !== 'string' || !CONVERSATION_ROLES.includes(role)) throw new Error(`${at}: unknown role ${JSON.stringify(role)} (expected ${CONVERSATION_ROLES.join(', ')})`);
      if (content === undefined || content === null) throw new Error(`${at}: field 'content' is missing`);
      if (typeof content !== 'string') throw new Error(`${at}: field 'content' is ${JSON.stringify(content)?.slice(0, 80)}, expected a string`);
      return { role: role as ConversationMessage['role'], content };
    });
    if (!messages.some((m) => m.role === 'assistant')) throw new Error(`${r.where}: no assistant message in 'messages' (nothing to learn)`);
    const meta = Object.fromEntries(Object.entries(r.value).filter(([k, v]) => k !== 'messages' && typeof v === 'string') as [string, string][]);
    return Object.keys(meta).length ? { messages, where: r.where, meta } : { messages, where: r.where };
  });
}
