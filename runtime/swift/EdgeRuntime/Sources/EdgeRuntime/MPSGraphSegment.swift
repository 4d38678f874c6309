import Foundation
import Metal
import MetalPerformanceShadersGraph

/// An `mpsgraph` segment: an MPSGraph built op by op from `program.json`, constants wrapped
/// from `weights.bin`. Each op name is the stem of the MPSGraph method it calls.
final class MPSGraphSegment: SegmentRunner {
    private struct Program: Decodable {
        struct Tensor: Decodable { let name: String; let dtype: String; let shape: [Int] }
        struct Constant: Decodable { let name: String; let dtype: String; let shape: [Int]; let offset: Int; let nbytes: Int }
        struct Op: Decodable { let op: String; let name: String; let inputs: [String]; let outputs: [String]; let attrs: [String: JSON] }
        let inputs: [Tensor]
        let outputs: [Tensor]
        let constants: [Constant]
        let ops: [Op]
    }

    private let graph = MPSGraph()
    private var placeholders: [String: MPSGraphTensor] = [:]
    private var results: [String: MPSGraphTensor] = [:]
    private let program: Program
    private let spec: SegmentSpec

    init(root: URL, spec: SegmentSpec) throws {
        self.spec = spec
        let directory = root.appendingPathComponent(spec.path)
        program = try JSONDecoder().decode(Program.self, from: Data(contentsOf: directory.appendingPathComponent("program.json")))
        let weights = try Data(contentsOf: directory.appendingPathComponent("weights.bin"), options: .alwaysMapped)
        var tensors: [String: MPSGraphTensor] = [:]
        for input in program.inputs {
            tensors[input.name] = graph.placeholder(shape: input.shape.map { NSNumber(value: $0) },
                                                    dataType: Self.dataType(input.dtype), name: input.name)
            placeholders[input.name] = tensors[input.name]
        }
        for constant in program.constants {
            let bytes = weights.subdata(in: constant.offset..<(constant.offset + constant.nbytes))
            tensors[constant.name] = graph.constant(bytes, shape: constant.shape.map { NSNumber(value: $0) },
                                                    dataType: Self.dataType(constant.dtype))
        }
        for op in program.ops {
            let made = try build(op, op.inputs.map { tensors[$0]! })
            for (name, tensor) in zip(op.outputs, made) { tensors[name] = tensor }
        }
        for output in program.outputs { results[output.name] = tensors[output.name] }
    }

    static func dataType(_ dtype: String) -> MPSDataType {
        switch dtype {
        case "float16": return .float16
        case "int64": return .int64
        case "int32": return .int32
        case "int8": return .int8
        case "uint8": return .uInt8
        case "bool": return .bool
        default: return .float32
        }
    }

    // swiftlint:disable:next cyclomatic_complexity function_body_length
    private func build(_ op: Program.Op, _ x: [MPSGraphTensor]) throws -> [MPSGraphTensor] {
        let a = op.attrs
        switch op.op {
        case "addition": return [graph.addition(x[0], x[1], name: op.name)]
        case "subtraction": return [graph.subtraction(x[0], x[1], name: op.name)]
        case "multiplication": return [graph.multiplication(x[0], x[1], name: op.name)]
        case "division": return [graph.division(x[0], x[1], name: op.name)]
        case "power": return [graph.power(x[0], x[1], name: op.name)]
        case "maximum": return [graph.maximum(x[0], x[1], name: op.name)]
        case "minimum": return [graph.minimum(x[0], x[1], name: op.name)]
        case "equal": return [graph.equal(x[0], x[1], name: op.name)]
        case "select": return [graph.select(predicate: x[0], trueTensor: x[1], falseTensor: x[2], name: op.name)]
        case "clamp": return [graph.clamp(x[0], min: x[1], max: x[2], name: op.name)]
        case "identity": return [graph.identity(with: x[0], name: op.name)]
        case "reLU": return [graph.reLU(with: x[0], name: op.name)]
        case "leakyReLU": return [graph.leakyReLU(with: x[0], alpha: a["alpha"]!.double, name: op.name)]
        case "sigmoid": return [graph.sigmoid(with: x[0], name: op.name)]
        case "tanh": return [graph.tanh(with: x[0], name: op.name)]
        case "erf": return [graph.erf(with: x[0], name: op.name)]
        case "exponent": return [graph.exponent(with: x[0], name: op.name)]
        case "logarithm": return [graph.logarithm(with: x[0], name: op.name)]
        case "squareRoot": return [graph.squareRoot(with: x[0], name: op.name)]
        case "reciprocal": return [graph.reciprocal(x[0], name: op.name)]
        case "negative": return [graph.negative(with: x[0], name: op.name)]
        case "absolute": return [graph.absolute(with: x[0], name: op.name)]
        case "cast": return [graph.cast(x[0], to: Self.dataType(a["dataType"]!.string), name: op.name)]
        case "matrixMultiplication": return [graph.matrixMultiplication(primary: x[0], secondary: x[1], name: op.name)]
        case "softMax": return [graph.softMax(with: x[0], axis: a["axis"]!.int, name: op.name)]
        case "reshape": return [graph.reshape(x[0], shape: a["shape"]!.numbers, name: op.name)]
        case "transpose": return [graph.transpose(x[0], permutation: a["permutation"]!.numbers, name: op.name)]
        case "concatTensors": return [graph.concatTensors(x, dimension: a["dimension"]!.int, name: op.name)]
        case "broadcast": return [graph.broadcast(x[0], shape: a["shape"]!.numbers, name: op.name)]
        case "sliceTensor":
            return [graph.sliceTensor(x[0], starts: a["starts"]!.numbers, ends: a["ends"]!.numbers,
                                      strides: a["strides"]!.numbers, name: op.name)]
        case "gatherWithUpdatesTensor":
            return [graph.gather(withUpdatesTensor: x[0], indicesTensor: x[1], axis: a["axis"]!.int,
                                 batchDimensions: a["batchDimensions"]?.int ?? 0, name: op.name)]
        case "reductionSum": return [graph.reductionSum(with: x[0], axes: a["axes"]!.numbers, name: op.name)]
        case "reductionMaximum": return [graph.reductionMaximum(with: x[0], axes: a["axes"]!.numbers, name: op.name)]
        case "mean": return [graph.mean(of: x[0], axes: a["axes"]!.numbers, name: op.name)]
        case "variance": return [graph.variance(of: x[0], axes: a["axes"]!.numbers, name: op.name)]
        case "normalization":
            return [graph.normalize(x[0], mean: x[1], variance: x[2], gamma: x[3], beta: x[4],
                                    epsilon: Float(a["epsilon"]!.double), name: op.name)]
        case "convolution2D":
            guard let descriptor = MPSGraphConvolution2DOpDescriptor(
                strideInX: a["strideInX"]!.int, strideInY: a["strideInY"]!.int,
                dilationRateInX: a["dilationRateInX"]!.int, dilationRateInY: a["dilationRateInY"]!.int,
                groups: a["groups"]!.int, paddingLeft: a["paddingLeft"]!.int, paddingRight: a["paddingRight"]!.int,
                paddingTop: a["paddingTop"]!.int, paddingBottom: a["paddingBottom"]!.int, paddingStyle: .explicit,
                dataLayout: .NCHW, weightsLayout: .OIHW) else { throw EdgeError.unsupported("convolution2D") }
            return [graph.convolution2D(x[0], weights: x[1], descriptor: descriptor, name: op.name)]
        case "maxPooling2D", "avgPooling2D":
            guard let descriptor = MPSGraphPooling2DOpDescriptor(
                kernelWidth: a["kernelWidth"]!.int, kernelHeight: a["kernelHeight"]!.int,
                strideInX: a["strideInX"]!.int, strideInY: a["strideInY"]!.int,
                dilationRateInX: a["dilationRateInX"]?.int ?? 1, dilationRateInY: a["dilationRateInY"]?.int ?? 1,
                paddingLeft: a["paddingLeft"]!.int, paddingRight: a["paddingRight"]!.int,
                paddingTop: a["paddingTop"]!.int, paddingBottom: a["paddingBottom"]!.int,
                paddingStyle: .explicit, dataLayout: .NCHW) else { throw EdgeError.unsupported(op.op) }
            descriptor.ceilMode = a["ceilMode"]?.bool ?? false
            descriptor.includeZeroPadToAverage = a["includeZeroPadToAverage"]?.bool ?? false
            return op.op == "maxPooling2D" ? [graph.maxPooling2D(withSourceTensor: x[0], descriptor: descriptor, name: op.name)]
                                           : [graph.avgPooling2D(withSourceTensor: x[0], descriptor: descriptor, name: op.name)]
        case "resizeTensor":
            let mode: MPSGraphResizeMode = a["mode"]!.string == "nearest" ? .nearest : .bilinear
            return [graph.resize(x[0], size: a["size"]!.numbers, mode: mode, centerResult: a["centerResult"]!.bool,
                                 alignCorners: a["alignCorners"]!.bool, layout: .NCHW, name: op.name)]
        case "scaledDotProductAttention":
            let scale = Float(a["scale"]!.double)
            if x.count > 3 {
                return [graph.scaledDotProductAttention(query: x[0], key: x[1], value: x[2], mask: x[3], scale: scale, name: op.name)]
            }
            return [graph.scaledDotProductAttention(query: x[0], key: x[1], value: x[2], scale: scale, name: op.name)]
        default:
            throw EdgeError.unsupported("MPSGraph op \(op.op) (node \(op.name)) in this runtime")
        }
    }

    func run(inputs: [String: Tensor], outputs: [String: Tensor], queue: MTLCommandQueue) throws {
        var feeds: [MPSGraphTensor: MPSGraphTensorData] = [:]
        for input in program.inputs {
            let tensor = inputs[input.name]!
            feeds[placeholders[input.name]!] = MPSGraphTensorData(tensor.buffer, shape: input.shape.map { NSNumber(value: $0) },
                                                                  dataType: Self.dataType(input.dtype))
        }
        var targets: [MPSGraphTensor: MPSGraphTensorData] = [:]
        for output in program.outputs {
            let tensor = outputs[output.name]!  // results land straight in the pooled buffer
            targets[results[output.name]!] = MPSGraphTensorData(tensor.buffer, shape: output.shape.map { NSNumber(value: $0) },
                                                                dataType: Self.dataType(output.dtype))
        }
        graph.run(with: queue, feeds: feeds, targetOperations: nil, resultsDictionary: targets)
    }
}

/// Just enough JSON to read op attributes.
enum JSON: Decodable {
    case number(Double), bool(Bool), string(String), array([JSON])

    init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Double.self) { self = .number(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else { self = .array(try container.decode([JSON].self)) }
    }

    var double: Double { if case .number(let v) = self { return v }; return 0 }
    var int: Int { Int(double) }
    var bool: Bool { if case .bool(let v) = self { return v }; return double != 0 }
    var string: String { if case .string(let v) = self { return v }; return "" }
    var numbers: [NSNumber] { if case .array(let values) = self { return values.map { NSNumber(value: $0.int) } }; return [] }
}
