import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as protobuf from 'protobufjs';
import { maskedCrc32c, TensorBoardWriter } from '../src';

/** CRC-32C bit by bit (Castagnoli, reflected polynomial 0x82F63B78): the definition, independent of the library the writer uses. */
function crc32cBitwise(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}
const mask = (crc: number) => ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;

/** The records of a TFRecord file, each checked against its two masked checksums. */
function readRecords(file: string): Buffer[] {
  const b = readFileSync(file);
  const out: Buffer[] = [];
  for (let at = 0; at < b.length; ) {
    const n = Number(b.readBigUInt64LE(at));
    expect(b.readUInt32LE(at + 8)).toBe(mask(crc32cBitwise(b.subarray(at, at + 8))));
    const data = b.subarray(at + 12, at + 12 + n);
    expect(b.readUInt32LE(at + 12 + n)).toBe(mask(crc32cBitwise(data)));
    out.push(data);
    at += 16 + n;
  }
  return out;
}

/** An Event's fields by number (1 wall_time, 2 step, 3 file_version, 5 summary → (1 tag, 2 simple_value)), read with protobuf's wire format. */
function decodeEvent(data: Uint8Array): { wallTime?: number; step?: number; fileVersion?: string; scalars: Record<string, number> } {
  const r = protobuf.Reader.create(data);
  const e: ReturnType<typeof decodeEvent> = { scalars: {} };
  while (r.pos < r.len) {
    const tag = r.uint32();
    const field = tag >>> 3;
    if (field === 1) e.wallTime = r.double();
    else if (field === 2) e.step = Number(r.int64());
    else if (field === 3) e.fileVersion = r.string();
    else if (field === 5) {
      const s = protobuf.Reader.create(r.bytes());
      while (s.pos < s.len) {
        s.uint32();
        const v = protobuf.Reader.create(s.bytes());
        let name = '';
        let value = NaN;
        while (v.pos < v.len) {
          const t = v.uint32();
          if (t >>> 3 === 1) name = v.string();
          else if (t >>> 3 === 2) value = v.float();
          else v.skipType(t & 7);
        }
        e.scalars[name] = value;
      }
    } else r.skipType(tag & 7);
  }
  return e;
}

test('the masked checksum is CRC-32C as TFRecord masks it (check value of "123456789": 0xE3069283)', () => {
  expect(crc32cBitwise(Buffer.from('123456789'))).toBe(0xe3069283);
  for (const s of ['', 'a', '123456789', 'brain.Event:2']) expect(maskedCrc32c(Buffer.from(s))).toBe(mask(crc32cBitwise(Buffer.from(s))));
});

test('an event file holds the file version, then one event per step with its finite numbers as scalars', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-tb-'));
  const w = new TensorBoardWriter(join(dir, 'tb'));
  w.log(10, { loss: 0.5, lr: 3e-4, name: 'x', bad: NaN, eval_accuracy: 1 });
  w.log(20, { loss: 0.25 });
  w.log(30, { note: 'no numbers' });
  expect(readdirSync(join(dir, 'tb'))).toEqual([w.file.split('/').at(-1)]);
  expect(w.file).toMatch(/events\.out\.tfevents\.\d+\./);
  const events = readRecords(w.file).map(decodeEvent);
  expect(events.map((e) => e.fileVersion ?? null)).toEqual(['brain.Event:2', null, null]);
  expect(events.slice(1).map((e) => [e.step, e.scalars])).toEqual([
    [10, { loss: 0.5, lr: Math.fround(3e-4), eval_accuracy: 1 }],
    [20, { loss: 0.25 }],
  ]);
  for (const e of events) expect(Math.abs(e.wallTime! - Date.now() / 1000)).toBeLessThan(60);
});

test("writers of one process in one folder within the same second (a resume) each get their own file, later in name order; none truncates another's", () => {
  const dir = join(mkdtempSync(join(tmpdir(), 'lathe-tb-')), 'tb');
  const first = new TensorBoardWriter(dir);
  first.log(1, { loss: 1 });
  const second = new TensorBoardWriter(dir);
  second.log(2, { loss: 2 });
  const third = new TensorBoardWriter(dir);
  expect(new Set([first.file, second.file, third.file]).size).toBe(3);
  // when all three fell in one second, the `.N` suffixes keep them in creation order
  const names = readdirSync(dir).sort();
  expect(names).toHaveLength(3);
  if (names.every((n) => n.split('.')[3] === names[0].split('.')[3])) expect(names.map((n) => join(dir, n))).toEqual([first.file, second.file, third.file]);
  expect(readRecords(first.file).map(decodeEvent).at(-1)!.scalars).toEqual({ loss: 1 });
  expect(readRecords(second.file).map(decodeEvent).at(-1)!.scalars).toEqual({ loss: 2 });
});
