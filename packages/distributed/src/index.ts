export * from './env';
export * from './collectives';
export * from './local';
export * from './tcp';
export * from './data-parallel';
export * from './nccl-library';
export * from './nccl';
