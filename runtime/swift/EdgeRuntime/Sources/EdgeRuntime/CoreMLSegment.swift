import CoreML
import Metal

/// A `coreml` segment: the compiled .mlpackage, fed MLMultiArrays over the pooled buffers.
final class CoreMLSegment: SegmentRunner {
    private let model: MLModel
    private let spec: SegmentSpec

    init(root: URL, spec: SegmentSpec) throws {
        guard let file = spec.files["model"] else { throw EdgeError.missing("segment \(spec.index): model") }
        let configuration = MLModelConfiguration()
        switch spec.compute_units {
        case "CPU_ONLY": configuration.computeUnits = .cpuOnly
        case "CPU_AND_GPU": configuration.computeUnits = .cpuAndGPU
        case "CPU_AND_NE": configuration.computeUnits = .cpuAndNeuralEngine
        default: configuration.computeUnits = .all
        }
        let compiled = try MLModel.compileModel(at: root.appendingPathComponent(file))
        model = try MLModel(contentsOf: compiled, configuration: configuration)
        self.spec = spec
    }

    func run(inputs: [String: Tensor], outputs: [String: Tensor], queue: MTLCommandQueue) throws {
        var features: [String: MLFeatureValue] = [:]
        for input in spec.inputs {
            features[input.key] = MLFeatureValue(multiArray: try inputs[input.name]!.multiArray())
        }
        let result = try model.prediction(from: MLDictionaryFeatureProvider(dictionary: features))
        for output in spec.outputs {
            guard let array = result.featureValue(for: output.key)?.multiArrayValue else {
                throw EdgeError.missing("segment \(spec.index): output \(output.key)")
            }
            outputs[output.name]!.fill(from: array)
        }
    }
}
