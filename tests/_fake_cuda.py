"""What the GEMV routes (gemv_route.mma_routed / mmh_routed) read of a weight tensor, without a GPU:
on CUDA device 0 at a 16-byte aligned address."""


class FakeCuda:
    is_cuda = True

    class device:
        index = 0

    @staticmethod
    def data_ptr():
        return 4096
