import CoreML
import Metal

/// A tensor living in a pooled shared MTLBuffer: dense, row-major (the manifest's `row_major`).
public struct Tensor {
    public let buffer: MTLBuffer
    public let spec: TensorSpec

    /// An MLMultiArray over the same bytes (no copy) for Core ML.
    public func multiArray() throws -> MLMultiArray {
        var strides = [Int](repeating: 1, count: spec.shape.count)
        for axis in stride(from: spec.shape.count - 2, through: 0, by: -1) {
            strides[axis] = strides[axis + 1] * spec.shape[axis + 1]
        }
        let type: MLMultiArrayDataType
        switch spec.dtype {
        case "float32": type = .float32
        case "float16": type = .float16
        case "int32": type = .int32
        default: throw EdgeError.unsupported("Core ML input of dtype \(spec.dtype)")
        }
        return try MLMultiArray(dataPointer: buffer.contents(), shape: spec.shape.map { NSNumber(value: $0) },
                                dataType: type, strides: strides.map { NSNumber(value: $0) })
    }

    /// Copies `array` (Core ML's output, possibly padded) into this tensor's buffer.
    public func fill(from array: MLMultiArray) {
        array.withUnsafeBytes { raw in
            buffer.contents().copyMemory(from: raw.baseAddress!, byteCount: min(raw.count, spec.byteCount))
        }
    }
}
