/**
 * DecodeAttention.step's host side with the combine folded into the split (`combine: 'fused'`), on a
 * stand-in for the kernels and driver that records launches and allocations: append + the fused split
 * (no combine launch) with the counter buffer as its argument; the buffer allocated zeroed on the
 * step's stream, reused for smaller batches, grown (the old one kept for graphs that captured it)
 * outside a capture and refused during one; dispose frees them all. A module of some groups (the
 * `groups` compile option): its source has those splits, its steps launch them, other groups are refused. The kernels themselves are tested
 * in decode-attention-emulated.slow.test.ts and on the device by tools/bench/kernels/decode-check.ts.
 */
import { DecodeAttention, decodeAttentionSource, decodeAttentionSourceFor, decodeKernelName, type DecodeAttentionShape, type DecodeStepArgs, type Kernels } from '@lathe/kernels';

interface Launch {
  name: string;
  grid: unknown;
  args: unknown[];
}

function fake(): { kernels: Kernels; launches: Launch[]; allocs: { ptr: bigint; bytes: number }[]; memsets: unknown[][]; freed: bigint[]; capturing: { on: boolean }; sources: string[] } {
  const launches: Launch[] = [];
  const allocs: { ptr: bigint; bytes: number }[] = [];
  const memsets: unknown[][] = [];
  const freed: bigint[] = [];
  const capturing = { on: false };
  const sources: string[] = [];
  let next = 0x1000n;
  const driver = {
    alloc: (bytes: number) => {
      const ptr = next;
      next += 0x1000n;
      allocs.push({ ptr, bytes });
      return ptr;
    },
    free: (ptr: bigint) => void freed.push(ptr),
    memsetD32: (...a: unknown[]) => void memsets.push(a),
    isCapturing: () => capturing.on,
  };
  const kernels = {
    stream: 77n,
    driver,
    compile: (source: string) => (sources.push(source), { kernel: (name: string) => ({ launch: (cfg: { grid: unknown }, ...args: unknown[]) => void launches.push({ name, grid: cfg.grid, args }) }) }),
  };
  return { kernels: kernels as unknown as Kernels, launches, allocs, memsets, freed, capturing, sources };
}

const shape = (rows: number): DecodeAttentionShape => ({ rows, numHeads: 16, numKvHeads: 8, headDim: 128, maxLength: 1024, dtype: 'bfloat16', cache: 'native' });
const args: DecodeStepArgs = { q: 1n, k: 2n, v: 3n, cacheK: 4n, cacheV: 5n, seqlens: 6n, cos: 7n, sin: 8n, out: 9n, qRot: 10n, oPart: 11n, lsePart: 12n };

test('separate: append, split and combine; fused: append and the fused split with the counters, no combine', () => {
  const f = fake();
  const da = DecodeAttention.compile(f.kernels, { includeDir: '/nowhere' });
  da.step(shape(4), args);
  expect(f.launches.map((l) => l.name)).toEqual([decodeKernelName.append('bfloat16', 'native', 128), decodeKernelName.split('bfloat16', 'native', 128, 2), decodeKernelName.combine('bfloat16', 128, 256)]);
  expect(f.allocs).toEqual([]);
  f.launches.length = 0;
  da.step(shape(4), args, undefined, undefined, { combine: 'fused' });
  expect(f.launches.map((l) => l.name)).toEqual([decodeKernelName.append('bfloat16', 'native', 128), 'da_splitc_bf16_d128_g2']);
  const split = f.launches[1];
  // 1,024 positions in chunks of 256 (the native plan at 2 query heads per KV head)
  expect(split.grid).toEqual([4, 8, 4]);
  // q, cache k/v, scales, seqlens, o_part, lse_part, out, counters, M, KV, chunks, scale
  expect(split.args.slice(8, 13)).toEqual([9n, f.allocs[0].ptr, 1024, 8, 4]);
  expect(f.allocs).toEqual([{ ptr: f.allocs[0].ptr, bytes: 4 * 4 * 8 }]);
  expect(f.memsets).toEqual([[f.allocs[0].ptr, 0, 32, 77n]]);
  // only the split part: the fused split; only the combine: nothing
  f.launches.length = 0;
  da.step(shape(4), args, 5n, ['split'], { combine: 'fused' });
  da.step(shape(4), args, 5n, ['combine'], { combine: 'fused' });
  expect(f.launches.map((l) => l.name)).toEqual(['da_splitc_bf16_d128_g2']);
});

test('the counters: reused for a smaller batch, grown outside a capture (the old kept), refused during one, all freed by dispose', () => {
  const f = fake();
  const da = DecodeAttention.compile(f.kernels, { includeDir: '/nowhere' });
  const fused = { combine: 'fused' as const };
  da.step({ ...shape(8), cache: 'float8e4m3' }, args, undefined, undefined, fused);
  expect(f.launches.at(-1)!.name).toBe(decodeKernelName.splitFused('bfloat16', 'float8e4m3', 128, 2));
  expect(f.launches.at(-1)!.name).toBe('da_splitc_fp8_bf16_d128_g2');
  f.capturing.on = true;
  da.step(shape(2), args, undefined, undefined, fused);
  expect(f.allocs.length).toBe(1);
  expect(() => da.step(shape(9), args, undefined, undefined, fused)).toThrow(/72 counters .* 64 exist, and the stream is capturing/);
  f.capturing.on = false;
  da.step(shape(9), args, undefined, undefined, fused);
  expect(f.allocs.map((a) => a.bytes)).toEqual([4 * 64, 4 * 72]);
  expect(f.launches.at(-1)!.args[9]).toBe(f.allocs[1].ptr);
  expect(f.freed).toEqual([]);
  da.dispose();
  expect(new Set(f.freed)).toEqual(new Set(f.allocs.map((a) => a.ptr)));
});

test('groups: a module of G 5 compiles its splits only and runs 40/8 heads; without groups every group; others named', () => {
  const f = fake();
  const all = DecodeAttention.compile(f.kernels, { includeDir: '/nowhere' });
  expect(all.groups).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  expect(f.sources).toEqual([decodeAttentionSource]);
  const g5 = DecodeAttention.compile(f.kernels, { includeDir: '/nowhere', groups: [5] });
  expect(g5.groups).toEqual([5]);
  expect(f.sources[1]).toBe(decodeAttentionSourceFor({ groups: [5] }));
  const qwen14 = (rows: number, cache: 'native' | 'float8e4m3'): DecodeAttentionShape => ({ ...shape(rows), numHeads: 40, numKvHeads: 8, cache });
  g5.step(qwen14(3, 'native'), args);
  g5.step(qwen14(3, 'float8e4m3'), args, undefined, undefined, { combine: 'fused' });
  expect(f.launches.map((l) => l.name)).toEqual([
    decodeKernelName.append('bfloat16', 'native', 128),
    'da_split_bf16_d128_g5',
    decodeKernelName.combine('bfloat16', 128, 128),
    decodeKernelName.append('bfloat16', 'float8e4m3', 128),
    'da_splitc_fp8_bf16_d128_g5',
  ]);
  // the combine runs a CTA per (row, query head): 3 · 40
  expect(f.launches[2].grid).toBe(120);
  // the e4m3 split: 1024 / 256 chunks, 8 KV heads, 3 rows
  expect(f.launches[4].grid).toEqual([4, 8, 3]);
  expect(() => g5.step(shape(2), args)).toThrow('decode attention: this module was compiled for 5 query heads per KV head, not 2 (16/8); DecodeAttention.compile(kernels, { groups: [2] }) or without groups for all');
  expect(() => all.step({ ...shape(2), numHeads: 72 }, args)).toThrow(/do not support 9 query heads per KV head/);
  expect(() => DecodeAttention.compile(f.kernels, { includeDir: '/nowhere', groups: [3, 9] })).toThrow(/no build for 9 query heads per KV head/);
  expect(f.sources.length).toBe(2);
});
