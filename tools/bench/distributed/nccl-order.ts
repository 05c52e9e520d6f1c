/**
 * The ordering of NCCL's stream with ONNX Runtime's, shown on the GPU (2+ ranks under the
 * launcher): an ORT run fills a large tensor, NCCL all-reduces it on its own stream, and another ORT
 * run reads it at once. With the wait NcclCollectives does (its stream synchronised before the
 * collective returns) the read sees the sum on every trial; with the wait skipped
 * (`unorderedForTest`) the read races NCCL and sees partial sums, which is what the wait prevents.
 *
 * usage: node .bundle/dp-launch.js --gpus 2 -- node .bundle/nccl-order.js [--mb 512] [--trials 10]
 * Prints one JSON line per rank: mismatches with the wait (must be 0) and without it.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { NcclCollectives, TcpCollectives, worldFromEnv } from '@lathe/distributed';
import { arg } from '../argv';

async function main(): Promise<void> {
  const world = worldFromEnv();
  if (world.worldSize < 2) throw new Error('run under the launcher with --gpus 2 or more');
  const tcp = await TcpCollectives.connect({ rank: world.rank, worldSize: world.worldSize, addr: world.masterAddr, port: world.masterPort });
  const nccl = await NcclCollectives.create(tcp, { deviceId: world.localRank });
  const device = Device.cuda({ id: world.localRank });
  const n = (Number(arg('mb', '512')) * 2 ** 20) / 4;
  const trials = Number(arg('trials', '10'));
  const g = new L.Graph('nccl_order_read');
  // the mean of the tensor, read by an ORT run on ORT's own stream
  g.output(L.div(L.reduceSum(g.input('x', 'float32', [n])), n), 'mean');
  const read = device.compile(g).binding();
  const x = device.empty('float32', [n]);
  read.input('x', x).output('mean', 'host');
  const expected = (world.worldSize * (world.worldSize + 1)) / 2; // Σ (rank + 1)
  const count = async (unordered: boolean) => {
    nccl.unorderedForTest = unordered;
    let wrong = 0;
    const seen: number[] = [];
    for (let t = 0; t < trials; t++) {
      x.fill(world.rank + 1); // an ORT run (the device's fill session), synchronised when it returns
      await nccl.allReduce([x], 'sum');
      read.runSync();
      const mean = read.scalar('mean');
      seen.push(+mean.toFixed(4));
      if (Math.abs(mean - expected) > 1e-3) wrong++;
      await nccl.barrier();
      // let NCCL finish before the next fill (the unordered trial left it running)
      nccl.unorderedForTest = false;
      await nccl.allReduce([], 'sum');
      nccl.unorderedForTest = unordered;
    }
    return { wrong, seen };
  };
  const ordered = await count(false);
  const unordered = await count(true);
  nccl.unorderedForTest = false;
  console.log(JSON.stringify({ rank: world.rank, world: world.worldSize, mb: Number(arg('mb', '512')), trials, expected_mean: expected, ordered, unordered }));
  x.dispose();
  await nccl.close();
}

main().catch((e: Error) => {
  process.stderr.write(`nccl-order rank ${process.env.RANK ?? 0}: ${e.stack ?? e.message}\n`);
  process.exit(1);
});
