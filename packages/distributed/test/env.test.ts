import { worldFromEnv } from '@lathe/distributed';

test('torchrun variables, with defaults for the optional ones', () => {
  expect(worldFromEnv({ RANK: '3', WORLD_SIZE: '4', LOCAL_RANK: '1', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'node-a', MASTER_PORT: '29700' })).toEqual({
    rank: 3,
    worldSize: 4,
    localRank: 1,
    localWorldSize: 2,
    masterAddr: 'node-a',
    masterPort: 29700,
    source: 'torchrun',
  });
  expect(worldFromEnv({ RANK: '1', WORLD_SIZE: '2' })).toMatchObject({ localRank: 1, localWorldSize: 2, masterAddr: '127.0.0.1', masterPort: 29500 });
});

test('Slurm variables (srun), SLURM_NTASKS_PER_NODE in its "4(x2)" form; MASTER_ADDR required across nodes', () => {
  const slurm = { SLURM_PROCID: '5', SLURM_NTASKS: '8', SLURM_LOCALID: '1', SLURM_NTASKS_PER_NODE: '4(x2)', MASTER_ADDR: 'gpu-001' };
  expect(worldFromEnv(slurm)).toEqual({ rank: 5, worldSize: 8, localRank: 1, localWorldSize: 4, masterAddr: 'gpu-001', masterPort: 29500, source: 'slurm' });
  expect(() => worldFromEnv({ ...slurm, MASTER_ADDR: undefined })).toThrow(/MASTER_ADDR is unset: export MASTER_ADDR=\$\(scontrol show hostnames/);
  // torchrun's variables win when both are set (torchrun inside an allocation)
  expect(worldFromEnv({ ...slurm, RANK: '0', WORLD_SIZE: '1' }).source).toBe('torchrun');
});

test('no variables: one process; bad values are named', () => {
  expect(worldFromEnv({})).toMatchObject({ rank: 0, worldSize: 1, source: 'single' });
  expect(() => worldFromEnv({ RANK: '2', WORLD_SIZE: '2' })).toThrow('RANK=2 is not below WORLD_SIZE=2');
  expect(() => worldFromEnv({ RANK: '0' })).toThrow('RANK and WORLD_SIZE must be set together (got RANK=0, WORLD_SIZE=unset)');
  expect(() => worldFromEnv({ RANK: 'x', WORLD_SIZE: '2' })).toThrow('RANK=x: expected an integer ≥ 0');
  expect(() => worldFromEnv({ RANK: '0', WORLD_SIZE: '2', MASTER_PORT: '70000' })).toThrow('MASTER_PORT=70000: a TCP port is at most 65535');
  expect(() => worldFromEnv({ RANK: '0', WORLD_SIZE: '2', LOCAL_RANK: '2', LOCAL_WORLD_SIZE: '2' })).toThrow('LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2');
});
