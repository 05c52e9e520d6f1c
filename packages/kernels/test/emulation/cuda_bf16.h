// Empty: test/emulation/emu.h stands in for this CUDA header when the kernels run on the CPU.
