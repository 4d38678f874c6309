import Foundation
import Metal

/// A built bundle, loaded once and run many times. Segments run in manifest order; every
/// tensor lives in a pooled shared buffer that the next segment reads in place.
public final class EdgeBundle {
    public let manifest: Manifest
    private let device: MTLDevice
    private let queue: MTLCommandQueue
    private let pool: BufferPool
    private let runners: [SegmentRunner]

    public init(url: URL, device: MTLDevice? = MTLCreateSystemDefaultDevice()) throws {
        guard let device, let queue = device.makeCommandQueue() else { throw EdgeError.metal("no Metal device") }
        self.device = device
        self.queue = queue
        pool = BufferPool(device: device)
        manifest = try Manifest.load(from: url)
        runners = try manifest.segments.map { segment -> SegmentRunner in
            switch segment.backend {
            case "coreml": return try CoreMLSegment(root: url, spec: segment)
            case "mpsgraph": return try MPSGraphSegment(root: url, spec: segment)
            case "msl": return try KernelSegment(root: url, spec: segment, device: device)
            default: throw EdgeError.unsupported("backend \(segment.backend)")
            }
        }
    }

    /// Runs the bundle on `inputs` (graph input name -> bytes, row-major); returns the outputs' bytes.
    public func run(_ inputs: [String: Data]) throws -> [String: Data] {
        var live: [String: Tensor] = [:]
        defer { live.values.forEach { pool.release($0.buffer) } }
        for spec in manifest.inputs {
            guard let data = inputs[spec.name], data.count == spec.byteCount else {
                throw EdgeError.missing("input \(spec.name): \(spec.byteCount) bytes of \(spec.dtype) \(spec.shape)")
            }
            let tensor = Tensor(buffer: try pool.acquire(bytes: spec.byteCount), spec: spec)
            data.withUnsafeBytes { tensor.buffer.contents().copyMemory(from: $0.baseAddress!, byteCount: data.count) }
            live[spec.name] = tensor
        }
        for (segment, runner) in zip(manifest.segments, runners) {
            var outputs: [String: Tensor] = [:]
            for spec in segment.outputs {
                outputs[spec.name] = Tensor(buffer: try pool.acquire(bytes: spec.byteCount), spec: spec)
            }
            // Core ML carries int64 as int32: a border whose dtype differs is converted by the
            // producer's spec (the manifest records each side), here assumed equal for brevity.
            try runner.run(inputs: live, outputs: outputs, queue: queue)
            live.merge(outputs) { _, new in new }
        }
        return manifest.outputs.reduce(into: [:]) { result, spec in
            result[spec.name] = Data(bytes: live[spec.name]!.buffer.contents(), count: spec.byteCount)
        }
    }
}
