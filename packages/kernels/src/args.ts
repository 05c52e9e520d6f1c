/**
 * Kernel arguments as `cuLaunchKernel` wants them: an array of pointers, one per parameter, each
 * pointing at that parameter's value. Values sit in 8-byte slots of one buffer (little-endian, so a
 * 4-byte parameter reads the low half of its slot).
 */
import * as koffi from 'koffi';
import { DeviceTensor } from '@lathe/runtime';

/** A kernel parameter's C type: a device pointer or a scalar. */
export type ArgType = 'ptr' | 'i32' | 'u32' | 'i64' | 'u64' | 'f32' | 'f64';

/** The JavaScript value each parameter type takes (a device tensor passes its data address). */
export type ArgValue<T extends ArgType> = T extends 'ptr' ? bigint | DeviceTensor : T extends 'i64' | 'u64' ? bigint | number : number;

/** The JavaScript values of a whole signature. */
export type ArgValues<S extends readonly ArgType[]> = { [K in keyof S]: S[K] extends ArgType ? ArgValue<S[K]> : never };

/** Packed arguments: `params` goes to `cuLaunchKernel`; `slots` must stay referenced until the launch returns. */
export interface PackedArgs {
  params: BigUint64Array;
  slots: ArrayBuffer;
}

const SLOT = 8;

/** Packs `values` by `signature`, checking count, ranges and integer-ness, naming the kernel and the parameter. */
export function packKernelArgs(kernel: string, signature: readonly ArgType[], values: readonly unknown[]): PackedArgs {
  if (values.length !== signature.length) throw new Error(`kernel '${kernel}' takes ${signature.length} arguments (${signature.join(', ')}), got ${values.length}`);
  const slots = new ArrayBuffer(Math.max(SLOT * signature.length, SLOT));
  const view = new DataView(slots);
  signature.forEach((type, i) => {
    const v = values[i];
    const at = i * SLOT;
    const bad = (want: string) => new Error(`kernel '${kernel}' argument ${i} (${type}): expected ${want}, got ${describe(v)}`);
    switch (type) {
      case 'ptr': {
        const p = v instanceof DeviceTensor ? v.devicePointer() : v;
        if (typeof p !== 'bigint' || p < 0n) throw bad('a device pointer (bigint) or a DeviceTensor');
        view.setBigUint64(at, p, true);
        break;
      }
      case 'i32':
      case 'u32': {
        const [lo, hi] = type === 'i32' ? [-(2 ** 31), 2 ** 31 - 1] : [0, 2 ** 32 - 1];
        if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) throw bad(`an integer in [${lo}, ${hi}]`);
        if (type === 'i32') view.setInt32(at, v, true);
        else view.setUint32(at, v, true);
        break;
      }
      case 'i64':
      case 'u64': {
        const b = typeof v === 'number' && Number.isSafeInteger(v) ? BigInt(v) : v;
        if (typeof b !== 'bigint' || (type === 'u64' && b < 0n)) throw bad(type === 'u64' ? 'a non-negative integer' : 'an integer');
        if (type === 'i64') view.setBigInt64(at, b, true);
        else view.setBigUint64(at, b, true);
        break;
      }
      case 'f32':
      case 'f64':
        if (typeof v !== 'number') throw bad('a number');
        if (type === 'f32') view.setFloat32(at, v, true);
        else view.setFloat64(at, v, true);
        break;
    }
  });
  const base = BigInt(koffi.address(slots) as bigint);
  const params = BigUint64Array.from(signature.map((_, i) => base + BigInt(i * SLOT)));
  return { params, slots };
}

function describe(v: unknown): string {
  if (v instanceof DeviceTensor) return v.describe();
  if (typeof v === 'bigint') return `${v}n`;
  return typeof v === 'number' ? String(v) : typeof v;
}
