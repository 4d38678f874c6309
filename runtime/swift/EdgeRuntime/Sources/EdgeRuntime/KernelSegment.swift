import Foundation
import Metal

/// An `msl` segment: `kernel.metal` compiled at load, dispatched with the sizes in `kernel.json`.
final class KernelSegment: SegmentRunner {
    private struct Binding: Decodable {
        let decl: String
        let tensor: String?
        let buffer: Int?
        let constant: Constant?
    }
    private struct Constant: Decodable { let dtype: String; let shape: [Int]; let offset: Int; let nbytes: Int }
    private struct Scalar: Decodable { let name: String; let buffer: Int; let dtype: String; let value: Double }
    private struct Record: Decodable {
        let entry: String
        let inputs: [Binding]
        let outputs: [Binding]
        let constants: [Scalar]
        let threads_per_grid: [Int]
        let threads_per_threadgroup: [Int]
    }

    private let pipeline: MTLComputePipelineState
    private let record: Record
    private let weights: MTLBuffer?

    init(root: URL, spec: SegmentSpec, device: MTLDevice) throws {
        guard let source = spec.files["source"], let json = spec.files["spec"] else {
            throw EdgeError.missing("segment \(spec.index): kernel source or spec")
        }
        record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: root.appendingPathComponent(json)))
        let library = try device.makeLibrary(source: String(contentsOf: root.appendingPathComponent(source)), options: nil)
        guard let function = library.makeFunction(name: record.entry) else {
            throw EdgeError.missing("kernel function \(record.entry)")
        }
        pipeline = try device.makeComputePipelineState(function: function)
        if let file = spec.files["constants"], let data = try? Data(contentsOf: root.appendingPathComponent(file)), !data.isEmpty {
            weights = data.withUnsafeBytes { device.makeBuffer(bytes: $0.baseAddress!, length: data.count, options: .storageModeShared) }
        } else {
            weights = nil
        }
    }

    func run(inputs: [String: Tensor], outputs: [String: Tensor], queue: MTLCommandQueue) throws {
        guard let commands = queue.makeCommandBuffer(), let encoder = commands.makeComputeCommandEncoder() else {
            throw EdgeError.metal("cannot encode kernel \(record.entry)")
        }
        encoder.setComputePipelineState(pipeline)
        for binding in record.inputs {
            if let tensor = binding.tensor {
                encoder.setBuffer(inputs[tensor]!.buffer, offset: 0, index: binding.buffer!)
            } else if let constant = binding.constant, let weights {  // shipped in constants.bin
                encoder.setBuffer(weights, offset: constant.offset, index: binding.buffer!)
            }
        }
        for binding in record.outputs {
            encoder.setBuffer(outputs[binding.tensor!]!.buffer, offset: 0, index: binding.buffer!)
        }
        for scalar in record.constants {
            switch scalar.dtype {
            case "float": var v = Float(scalar.value); encoder.setBytes(&v, length: 4, index: scalar.buffer)
            case "int": var v = Int32(scalar.value); encoder.setBytes(&v, length: 4, index: scalar.buffer)
            default: var v = UInt32(scalar.value); encoder.setBytes(&v, length: 4, index: scalar.buffer)
            }
        }
        let grid = record.threads_per_grid, group = record.threads_per_threadgroup
        encoder.dispatchThreads(MTLSize(width: grid[0], height: grid[1], depth: grid[2]),
                                threadsPerThreadgroup: MTLSize(width: group[0], height: group[1], depth: group[2]))
        encoder.endEncoding()
        commands.commit()
        commands.waitUntilCompleted()
    }
}
