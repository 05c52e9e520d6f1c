/**
 * The CPU side of the W4A16 launch-plan tuning: the table's lookup (same N, K, block size and dtype,
 * the fewest tuned rows ≥ M, else the default plan), its JSON round trip and refusals, the options'
 * checks, and the launch options a table gives. The timing itself runs on CUDA
 * (`quant-bench.js --kernel-sweep --weights kernel,kernel-tuned`).
 */
import { Device } from '@lathe/runtime';
import { W4A16PlanTable, tuneW4A16, w4a16Plan, w4a16TuneCandidates, type W4A16, type W4A16Shape, type W4A16TuneEntry } from '@lathe/kernels';

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

test('tuning options are checked before any device work: rows 1–16, rounds and iterations ≥ 1, column tiles 1 or 2; the kernels need cuda', () => {
  expect(w4a16TuneCandidates()).toEqual({ rows: [1, 4, 8, 16], rounds: [1, 2, 3, 4, 6, 8], columnTiles: [1, 2], iters: 200 });
  expect(() => w4a16TuneCandidates({ rows: [1, 32] })).toThrow(/rows \[1, 32\] must be row counts 1–16/);
  expect(() => w4a16TuneCandidates({ rounds: [0] })).toThrow(/rounds \[0\] must be integers ≥ 1/);
  expect(() => w4a16TuneCandidates({ columnTiles: [3 as 1] })).toThrow(/columnTiles \[3\] must be 1 or 2/);
  expect(() => w4a16TuneCandidates({ iters: 0 })).toThrow(/iters 0 must be an integer ≥ 1/);
  const cpu = Device.open('cpu');
  // no W4A16 can be compiled without CUDA: the device check comes first
  expect(() => tuneW4A16({} as W4A16, cpu, [])).toThrow(/the W4A16 kernels run on cuda, not cpu/);
});
