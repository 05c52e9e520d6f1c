/**
 * @lathe/runtime — ONNX Runtime sessions with device-resident tensors. Weights, optimizer state and
 * caches live in device memory (`DeviceTensor`) and are bound to session inputs and outputs by
 * address through ORT's C API (IoBinding), so runs move only what the caller asks for.
 */
export { CApi, OrtError, namedKoffiType, openNativeLibrary, ortLibraryDir, ORT_API_VERSION, type NativeLibrary, type Ptr } from './capi';
export { type LogLevel } from './env';
export { Device, type CudaDeviceOptions, type DeviceKind, type MemoryReport } from './device';
export { DeviceTensor } from './tensor';
export { Session, Binding, type SessionOptions, type TensorInfo, type RunOptions, type OutputPlacement } from './session';
export { byteSize, checkHostTensor, hostArrayType, hostTensor, sizeOf, type HostArray, type HostTensor } from './host';
export { bytesToFloat32, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from './half';
export { PlainSession, type SessionDevice } from './plain';
export { availableProviders, diagnose, type DoctorCheck } from './doctor';
