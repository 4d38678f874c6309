import Metal

/// One segment of a bundle: reads its inputs' tensors, writes its outputs' tensors.
protocol SegmentRunner {
    func run(inputs: [String: Tensor], outputs: [String: Tensor], queue: MTLCommandQueue) throws
}
