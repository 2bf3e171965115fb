/* placeholder */ extern "C" int gn_attest_cuda_abi(void) { return 0; }
