/** `lathe launch`'s options: defaults, flags and YAML keys. */
import type { ConfigOf, OptionSchema } from './options';

/** Every option of `lathe launch` (the command to run follows `--`). */
export const launchSchema = {
  gpus: { type: 'number', default: 1, integer: true, min: 1, describe: 'Processes to start on this host, one per GPU: rank i of this host gets LOCAL_RANK=i and uses GPU i (on --device cpu, one CPU process per rank)' },
  nnodes: { type: 'number', default: 1, integer: true, min: 1, describe: 'Hosts in the job, each running lathe launch with the same --gpus, --master_addr and --master_port (WORLD_SIZE = nnodes × gpus)' },
  node_rank: { type: 'number', default: 0, integer: true, min: 0, describe: "This host's index, 0 … nnodes − 1 (its ranks are node_rank × gpus + LOCAL_RANK); node 0 hosts the rendezvous" },
  master_addr: { type: 'string', default: '127.0.0.1', describe: 'Address of node 0, where rank 0 hosts the rendezvous (MASTER_ADDR)' },
  master_port: { type: 'number', default: 29500, integer: true, min: 1, max: 65535, describe: "Port of the rendezvous (MASTER_PORT); two jobs on one host need two ports" },
  grace_s: { type: 'number', default: 5, min: 0, describe: 'After a rank fails, seconds the other ranks get to exit on their own (they see the failure at their next collective) before SIGTERM, and again before SIGKILL' },
} as const satisfies OptionSchema;

/** A resolved `lathe launch` config. */
export type LaunchConfig = ConfigOf<typeof launchSchema>;
