"""`cudagraph_capture_sizes` and `decode_batch_class`: the decode graphs are captured at the batch
classes, so the class of every batch up to the largest graph is a captured size, and the decode
kernels, which choose their launch by class, meet no launch in an eager step that the capture did
not compile."""

from vllm.config.vllm import cudagraph_capture_sizes, decode_batch_class


def test_batch_classes():
    assert [decode_batch_class(n) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert [decode_batch_class(n) for n in (17, 249, 256, 257, 272, 273)] == [
        24, 256, 256, 272, 272, 288
    ]  # fmt: skip
    for n in range(1, 1025):
        c = decode_batch_class(n)
        # the smallest class size at least n
        assert c >= n and decode_batch_class(c) == c
        assert all(decode_batch_class(m) != m for m in range(n, c))


def test_capture_sizes_are_the_classes_up_to_the_cap():
    eights = list(range(8, 257, 8))
    assert cudagraph_capture_sizes(512, None) == [1, 2, 4, *eights, *range(272, 513, 16)]
    assert cudagraph_capture_sizes(100, None) == [1, 2, 4, *range(8, 97, 8), 100]
    assert cudagraph_capture_sizes(256, 48) == [1, 2, 4, 8, 16, 24, 32, 40, 48]
    assert cudagraph_capture_sizes(3, None) == [1, 2, 3]
    assert cudagraph_capture_sizes(0, None) == []
    for cap in (1, 7, 100, 300, 512):
        sizes = cudagraph_capture_sizes(cap, None)
        assert all(decode_batch_class(n) in sizes for n in range(1, cap + 1) if
                   decode_batch_class(n) <= cap)  # fmt: skip
