/**
 * JSON Lines in and out, plain or gzip-compressed (detected from the file's first bytes, so a
 * `.jsonl.gz` named `.jsonl` still reads). Reads stream line by line; errors name the file and line.
 */
import { createReadStream, createWriteStream, renameSync, rmSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { createGunzip, createGzip } from 'node:zlib';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import { leadingBytes } from './files';

/** One parsed line: the object and its 1-based line number in the file. */
export interface JsonlRecord {
  value: Record<string, unknown>;
  line: number;
}

function isGzip(file: string): boolean {
  const b = leadingBytes(file, 2);
  return b.length === 2 && b[0] === 0x1f && b[1] === 0x8b;
}

/**
 * Streams the objects of a JSONL or JSONL.gz file. Blank lines are skipped; a line that is not a
 * JSON object is an error naming `file:line`.
 */
export async function* readJsonl(file: string): AsyncGenerator<JsonlRecord> {
  const gz = isGzip(file);
  const raw = createReadStream(file);
  const input = gz ? raw.pipe(createGunzip()) : raw;
  if (gz) raw.on('error', (e) => input.destroy(e));
  const lines = createInterface({ input, crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of lines) {
      line++;
      if (text.trim() === '') continue;
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (e) {
        throw new Error(`${file}:${line}: not valid JSON (${(e as Error).message})`);
      }
      if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error(`${file}:${line}: expected a JSON object, got ${Array.isArray(value) ? 'an array' : JSON.stringify(value)}`);
      yield { value: value as Record<string, unknown>, line };
    }
  } catch (e) {
    const msg = (e as Error).message;
    throw msg.startsWith(file) ? e : new Error(`${file}:${line + 1}: cannot read${gz ? ' (gzip)' : ''}: ${msg}`);
  } finally {
    lines.close();
    input.destroy();
    raw.destroy();
  }
}

/** All objects of a JSONL(.gz) file, in order. */
export async function readJsonlAll(file: string): Promise<JsonlRecord[]> {
  const out: JsonlRecord[] = [];
  for await (const r of readJsonl(file)) out.push(r);
  return out;
}

/**
 * Writes objects as JSON Lines, gzip-compressed when the name ends in `.gz`; the file appears under
 * its name only when complete (written to a temporary name, then renamed). Returns the lines written.
 */
export async function writeJsonl(file: string, rows: Iterable<unknown> | AsyncIterable<unknown>): Promise<number> {
  const tmp = `${file}.tmp-${process.pid}`;
  let n = 0;
  async function* lines() {
    for await (const r of rows as AsyncIterable<unknown>) {
      n++;
      yield `${JSON.stringify(r)}\n`;
    }
  }
  try {
    const src = Readable.from(lines());
    if (file.endsWith('.gz')) await pipeline(src, createGzip(), createWriteStream(tmp));
    else await pipeline(src, createWriteStream(tmp));
    renameSync(tmp, file);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw new Error(`${file}: cannot write (${(e as Error).message})`);
  }
  return n;
}
