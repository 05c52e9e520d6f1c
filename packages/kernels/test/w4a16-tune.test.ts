/**
 * The CPU side of the W4A16 launch-plan tuning: the table's lookup (same N, K, block size and dtype,
 * the fewest tuned rows ≥ M, else the default plan), its JSON round trip and refusals, the options'
 * checks, and the launch options a table gives. The timing itself runs on CUDA
 * (`quant-bench.js --kernel-sweep --weights kernel,kernel-tuned`).
 */
import { Device } from '@lathe/runtime';
import { W4A16, W4A16PlanTable, tuneW4A16, w4a16Plan, w4a16TuneCandidates, type W4A16Shape, type W4A16Tile, type W4A16TuneEntry } from '@lathe/kernels';

const entry = (over: Partial<W4A16TuneEntry>): W4A16TuneEntry => ({ name: 'gate_up_proj', N: 12288, K: 2048, blockSize: 64, dtype: 'bfloat16', M: 16, columnTiles: 2, rounds: 4, warps: 4, us: 11.3, defaultUs: 17.8, ...over });
const shape = (over: Partial<W4A16Shape>): W4A16Shape => ({ M: 16, N: 12288, K: 2048, kBlocks: 32, blockSize: 64, dtype: 'bfloat16', ...over });

const table = new W4A16PlanTable([
  entry({ M: 1, columnTiles: 2, rounds: 4 }),
  entry({ M: 8, columnTiles: 1, rounds: 2 }),
  entry({ M: 16, columnTiles: 2, rounds: 4 }),
  entry({ name: 'qkv_proj', N: 4096, M: 16, columnTiles: 2, rounds: 1, warps: 16 }),
]);

test('a launch takes the entry of its shape with the fewest tuned rows ≥ M; another shape, block size, dtype or more rows keep the default plan', () => {
  expect(table.plan(shape({ M: 1 }))).toEqual({ columnTiles: 2, rounds: 4 });
  expect(table.plan(shape({ M: 5 }))).toEqual({ columnTiles: 1, rounds: 2 });
  expect(table.plan(shape({ M: 8 }))).toEqual({ columnTiles: 1, rounds: 2 });
  expect(table.plan(shape({ M: 9 }))).toEqual({ columnTiles: 2, rounds: 4 });
  expect(table.plan(shape({ N: 4096, M: 3 }))).toEqual({ columnTiles: 2, rounds: 1 });
  expect(table.plan(shape({ M: 17 }))).toBeUndefined();
  expect(table.plan(shape({ N: 2048 }))).toBeUndefined();
  expect(table.plan(shape({ blockSize: 128, kBlocks: 16 }))).toBeUndefined();
  expect(table.plan(shape({ dtype: 'float16' }))).toBeUndefined();
});

test("the table's launch options keep the base options and plan each launch from the table; the plan it gives is the kernel's launch", () => {
  const o = table.launchOptions({ tileFromRows: 17, columnTiles: 1 });
  expect(o.tileFromRows).toBe(17);
  expect(o.columnTiles).toBe(1);
  const choice = o.plan!(shape({ M: 16 }))!;
  // 32 blocks of 64 = 16 chunks of 128 in 4 rounds: 4 warps, two column tiles of 16 → 384 CTAs
  expect(w4a16Plan(shape({ M: 16 }), choice.columnTiles, choice.rounds)).toMatchObject({ mt: 2, nt: 2, warps: 4, grid: [384, 1] });
});

test('a table survives JSON; a malformed entry is refused by its index', () => {
  const back = W4A16PlanTable.fromJSON(JSON.parse(JSON.stringify(table)));
  expect(back.entries).toEqual(table.entries);
  expect(back.plan(shape({ M: 5 }))).toEqual({ columnTiles: 1, rounds: 2 });
  expect(() => W4A16PlanTable.fromJSON({})).toThrow(/expected \{ entries: \[\.\.\.\] \}/);
  expect(() => W4A16PlanTable.fromJSON({ entries: [entry({}), { ...entry({}), columnTiles: 4 }] })).toThrow(/entry 1 is not a plan/);
  expect(() => W4A16PlanTable.fromJSON({ entries: [{ ...entry({}), rounds: 0 }] })).toThrow(/entry 0 is not a plan/);
});

test('tuning options are checked before any device work: rows 1–16 (256 with the tiled builds), rounds and iterations ≥ 1, column tiles 1 or 2; the kernels need cuda', () => {
  expect(w4a16TuneCandidates()).toEqual({ rows: [1, 4, 8, 16], rounds: [1, 2, 3, 4, 6, 8], columnTiles: [1, 2], iters: 200, tiles: false });
  expect(() => w4a16TuneCandidates({ rows: [1, 32] })).toThrow(/rows \[1, 32\] must be row counts 1–16 .*up to 256 with tiles: true/);
  // with the tiled builds timed too, decode batches up to 256
  expect(w4a16TuneCandidates({ rows: [16, 64, 256], tiles: true })).toMatchObject({ rows: [16, 64, 256], tiles: true });
  expect(() => w4a16TuneCandidates({ rows: [512], tiles: true })).toThrow(/rows \[512\] must be row counts 1–256/);
  expect(() => w4a16TuneCandidates({ rounds: [0] })).toThrow(/rounds \[0\] must be integers ≥ 1/);
  expect(() => w4a16TuneCandidates({ columnTiles: [3 as 1] })).toThrow(/columnTiles \[3\] must be 1 or 2/);
  expect(() => w4a16TuneCandidates({ iters: 0 })).toThrow(/iters 0 must be an integer ≥ 1/);
  const cpu = Device.open('cpu');
  // no W4A16 can be compiled without CUDA: the device check comes first
  expect(() => tuneW4A16({} as W4A16, cpu, [])).toThrow(/the W4A16 kernels run on cuda, not cpu/);
});

// A tiled build as the tuner records it (every field of its warp layout spelled out).
const tile64x256: W4A16Tile = { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 1 };

test('a tiled entry plans its build; a split-K entry past 16 rows keeps the split-K kernels; both survive JSON, a tile that is no build is refused', () => {
  const t = new W4A16PlanTable([entry({ M: 16 }), entry({ M: 64, columnTiles: 1, rounds: 1, warps: 8, tile: tile64x256 }), entry({ M: 32, N: 4096, columnTiles: 2, rounds: 2 })]);
  expect(t.plan(shape({ M: 40 }))).toEqual({ tile: tile64x256 });
  expect(t.plan(shape({ M: 16 }))).toEqual({ columnTiles: 2, rounds: 4 });
  expect(t.plan(shape({ M: 24, N: 4096 }))).toEqual({ columnTiles: 2, rounds: 2 });
  expect(t.plan(shape({ M: 65 }))).toBeUndefined();
  const back = W4A16PlanTable.fromJSON(JSON.parse(JSON.stringify(t)));
  expect(back.plan(shape({ M: 40 }))).toEqual({ tile: tile64x256 });
  expect(() => W4A16PlanTable.fromJSON({ entries: [entry({ tile: { ...tile64x256, wn: 2 } })] })).toThrow(/entry 0 is not a plan .*a tiled build/);
});

test('W4A16.matmul launches what a plan chooses: its tiled build at any M, its split-K plan past tileFromRows; without one, split-K below 17 rows and the estimated tile from there', () => {
  // the routing alone, over stand-in kernels that record their launches (the kernels themselves need CUDA)
  const launches: string[] = [];
  const recorder = (prefix: string) => ({ get: (key: string) => ({ launch: (cfg: { grid: number[] }) => launches.push(`${prefix}:${key}:${cfg.grid.join('x')}`) }) });
  const w4 = Object.assign(Object.create(W4A16.prototype) as object, { kernels: { arch: 90, smCount: 132 }, variants: recorder('split'), tiles: recorder('tile') }) as unknown as W4A16;
  const args = { a: 0n, b: 0n, scales: 0n, zeroPoints: 0n, c: 0n };
  const t = new W4A16PlanTable([entry({ M: 64, columnTiles: 1, rounds: 1, warps: 8, tile: tile64x256 }), entry({ M: 32, N: 4096, columnTiles: 2, rounds: 2 })]);
  w4.matmul(shape({ M: 40 }), args, undefined, t.launchOptions());
  w4.matmul(shape({ M: 8 }), args, undefined, t.launchOptions());
  w4.matmul(shape({ M: 24, N: 4096 }), args, undefined, t.launchOptions());
  w4.matmul(shape({ M: 128 }), args, undefined, t.launchOptions());
  w4.matmul(shape({ M: 8, N: 2048 }), args, undefined, {});
  expect(launches[0]).toBe('tile:bfloat16/64x256w8:48x1x1'); // the plan's tile, 12,288 / 256 columns
  expect(launches[1]).toMatch(/^tile:bfloat16\/64x256w8:/); // the 64-row entry covers 8 rows too (fewest tuned rows ≥ M)
  expect(launches[2]).toBe('split:bfloat16/4/1:256x1'); // split-K past tileFromRows: 24 rows in 4 n8 tiles, 16 columns a CTA (two column tiles are built up to 16 rows)
  expect(launches[3]).toMatch(/^tile:bfloat16\//); // past every entry: the estimated tile
  expect(launches[4]).toBe('split:bfloat16/1/1:128x1'); // no plan, 8 rows: split-K's default
});
