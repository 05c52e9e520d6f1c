/**
 * The collectives' semantics, checked against values computed by hand from each rank's inputs, on
 * the in-process group and on the TCP backend (ranks as separate connections in one process).
 */
import { Device, type DeviceTensor } from '@lathe/runtime';
import { DistributedError, LocalGroup, TcpCollectives, type Collectives } from '@lathe/distributed';

const cpu = Device.cpu();
const up = (v: number[]): DeviceTensor => cpu.upload({ data: Float32Array.from(v), dims: [v.length] });
const down = (t: DeviceTensor) => Array.from(t.download().data as Float32Array);

async function tcpGroup(n: number, port: number): Promise<TcpCollectives[]> {
  return Promise.all(Array.from({ length: n }, (_, rank) => TcpCollectives.connect({ rank, worldSize: n, addr: '127.0.0.1', port, timeoutMs: 10_000 })));
}

/** Every operation once, on 3 ranks whose inputs depend on the rank. */
async function exercise(group: Collectives[]): Promise<void> {
  const results = await Promise.all(
    group.map(async (c) => {
      const r = c.rank;
      const a = up([r, 10 * r, 1]);
      const b = up([r + 0.5]);
      await c.allReduce([a, b], 'sum');
      const avg = up([r, 2 * r]);
      await c.allReduce([avg], 'avg');
      const rsIn = up([1 + r, 2 + r, 3 + r, 4 + r, 5 + r, 6 + r]); // 3 ranks × 2
      const rsOut = up([0, 0]);
      await c.reduceScatter(rsIn, rsOut, 'sum');
      const agOut = up([0, 0, 0, 0, 0, 0]);
      await c.allGather(up([r, -r]), agOut);
      const bc = up([r, r]);
      await c.broadcast([bc], 2);
      const host = Float64Array.from([r, 1]);
      await c.allReduceHost(host, 'sum');
      const bytes = await c.allGatherBytes(new TextEncoder().encode('x'.repeat(r + 1)));
      await c.barrier();
      return { a: down(a), b: down(b), avg: down(avg), rs: down(rsOut), ag: down(agOut), bc: down(bc), host: Array.from(host), bytes: bytes.map((x) => new TextDecoder().decode(x)) };
    }),
  );
  results.forEach((res, r) => {
    expect(res.a).toEqual([0 + 1 + 2, 0 + 10 + 20, 3]);
    expect(res.b).toEqual([0.5 + 1.5 + 2.5]);
    expect(res.avg).toEqual([1, 2]);
    // column sums of [1..6] + r over r = 0, 1, 2: 3 × (k + 1) + 3; rank r keeps elements 2r, 2r + 1
    const sums = [1, 2, 3, 4, 5, 6].map((k) => 3 * k + 3);
    expect(res.rs).toEqual(sums.slice(2 * r, 2 * r + 2));
    expect(res.ag).toEqual([0, -0, 1, -1, 2, -2]);
    expect(res.bc).toEqual([2, 2]);
    expect(res.host).toEqual([3, 3]);
    expect(res.bytes).toEqual(['x', 'xx', 'xxx']);
  });
}

test('in-process group: all-reduce (sum, avg), reduce-scatter, all-gather, broadcast, host values, bytes, barrier', async () => {
  await exercise(LocalGroup.create(3));
});

test('TCP group (rank 0 hosts): the same operations give the same results', async () => {
  const group = await tcpGroup(3, 29611);
  await exercise(group);
  await Promise.all(group.map((c) => c.close()));
});

test('in-process group: an abort fails the other ranks\' pending operations, naming the rank', async () => {
  const [a, b] = LocalGroup.create(2);
  const pending = a.allReduceHost(Float64Array.from([1]));
  b.abort('out of memory');
  await expect(pending).rejects.toThrow(/rank 1 aborted: out of memory/);
  await expect(b.barrier()).rejects.toBeInstanceOf(DistributedError);
});

test('TCP group: a rank whose connection drops (its process died) fails the others within the round, named', async () => {
  const group = await tcpGroup(3, 29612);
  const [r0, r1, r2] = group;
  const p0 = r0.barrier();
  const p1 = r1.barrier();
  // rank 2 vanishes without a goodbye, as a killed process does
  (r2 as unknown as { sockets: Map<number, { destroy(): void }> }).sockets.get(0)!.destroy();
  await expect(p0).rejects.toThrow(/rank 2 disconnected: its process exited or crashed/);
  await expect(p1).rejects.toThrow(/rank 2 disconnected/);
  await Promise.all(group.map((c) => c.close()));
});

test('TCP group: rank 0 dying is named by the others; a rank that cannot reach the rendezvous is told where it looked', async () => {
  const [r0, r1] = await tcpGroup(2, 29613);
  const p1 = r1.barrier();
  (r0 as unknown as { sockets: Map<number, { destroy(): void }>; server: { close(): void } }).sockets.get(1)!.destroy();
  await expect(p1).rejects.toThrow(/rank 0 \(the rendezvous host at 127\.0\.0\.1:29613\) disconnected/);
  await r0.close();
  await expect(TcpCollectives.connect({ rank: 1, worldSize: 2, addr: '127.0.0.1', port: 29614, timeoutMs: 500 })).rejects.toThrow(/cannot reach rank 0 within 0.5 s .*MASTER_ADDR/);
});

test('TCP group: a rank that leaves in order while rank 0 still expects it in a round fails rank 0, named (no hang)', async () => {
  const [r0, r1] = await tcpGroup(2, 29617);
  await r1.close();
  await expect(r0.barrier()).rejects.toThrow('rank 1 left the group while the others still expected it in a collective');
  await r0.close();
});

test('TCP rendezvous: a process with another world size is refused with both sizes named; a busy port is named', async () => {
  const host = TcpCollectives.connect({ rank: 0, worldSize: 2, addr: '127.0.0.1', port: 29615, timeoutMs: 3000 });
  await expect(TcpCollectives.connect({ rank: 1, worldSize: 3, addr: '127.0.0.1', port: 29615, timeoutMs: 3000 })).rejects.toThrow(/WORLD_SIZE is 3, rank 0's is 2/);
  await expect(host).rejects.toThrow(/ranks 1 did not connect/);
  const [a, b] = await tcpGroup(2, 29616);
  await expect(TcpCollectives.connect({ rank: 0, worldSize: 2, addr: '127.0.0.1', port: 29616 })).rejects.toThrow(/port 29616 is in use.*--master_port/);
  await Promise.all([a.close(), b.close()]);
});
