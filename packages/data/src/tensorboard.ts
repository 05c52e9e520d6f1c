/**
 * TensorBoard event files, so `tensorboard --logdir runs/` plots a run's metrics. A file is a
 * sequence of TFRecords — uint64 length, masked CRC-32C of the length, the bytes, masked CRC-32C of
 * the bytes (little-endian) — each holding one `Event` protocol buffer: first the file version,
 * then one event per logged step with every numeric metric as a scalar. The messages are declared
 * here from TensorFlow's event.proto and summary.proto field numbers (only the fields written).
 * No maintained Node writer exists; the framing is the documented TFRecord format.
 */
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import * as protobuf from 'protobufjs';
import { buf as crc32c } from 'crc-32/crc32c';
import type { MetricSink } from './run-dir';

const root = protobuf.Root.fromJSON({
  nested: {
    tensorflow: {
      nested: {
        Event: {
          fields: {
            wallTime: { type: 'double', id: 1 },
            step: { type: 'int64', id: 2 },
            fileVersion: { type: 'string', id: 3 },
            summary: { type: 'Summary', id: 5 },
          },
        },
        Summary: {
          fields: { value: { rule: 'repeated', type: 'Value', id: 1 } },
          nested: { Value: { fields: { tag: { type: 'string', id: 1 }, simpleValue: { type: 'float', id: 2 } } } },
        },
      },
    },
  },
});
const EventType = root.lookupType('tensorflow.Event');

/** TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant, as uint32. */
export function maskedCrc32c(bytes: Uint8Array): number {
  const crc = crc32c(bytes) >>> 0;
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** One TFRecord holding `data`. */
export function tfRecord(data: Uint8Array): Buffer {
  const header = Buffer.alloc(12);
  header.writeBigUInt64LE(BigInt(data.length), 0);
  header.writeUInt32LE(maskedCrc32c(header.subarray(0, 8)), 8);
  const footer = Buffer.alloc(4);
  footer.writeUInt32LE(maskedCrc32c(data), 0);
  return Buffer.concat([header, data, footer]);
}

/** Writes one run's scalars as a TensorBoard event file in `dir` (created if missing). */
export class TensorBoardWriter implements MetricSink {
  /** The event file. */
  readonly file: string;

  constructor(dir: string) {
    mkdirSync(dir, { recursive: true });
    // TensorBoard reads every file named events.out.tfevents.* in a folder, in name order; a second
    // writer of this process within the same second (a resume) takes the next free `.N` suffix,
    // created exclusively, rather than truncating the first one's file
    const base = join(dir, `events.out.tfevents.${Math.floor(Date.now() / 1000)}.${hostname()}.${process.pid}`);
    const header = this.record({ wallTime: Date.now() / 1000, fileVersion: 'brain.Event:2' });
    for (let n = 0; ; n++) {
      const file = n === 0 ? base : `${base}.${n}`;
      try {
        writeFileSync(file, header, { flag: 'wx' });
        this.file = file;
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      }
    }
  }

  /** Logs each finite number of `values` as the scalar `tag` at `step` (other values are left out). */
  log(step: number, values: Readonly<Record<string, unknown>>): void {
    const value = Object.entries(values).flatMap(([tag, v]) => (typeof v === 'number' && Number.isFinite(v) ? [{ tag, simpleValue: v }] : []));
    if (value.length === 0) return;
    appendFileSync(this.file, this.record({ wallTime: Date.now() / 1000, step, summary: { value } }));
  }

  private record(event: Record<string, unknown>): Buffer {
    return tfRecord(EventType.encode(EventType.create(event)).finish());
  }
}
