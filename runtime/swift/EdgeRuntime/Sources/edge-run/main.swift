import EdgeRuntime
import Foundation

// edge-run BUNDLE_DIR: runs the bundle once on ones and prints each output's shape and sum.
guard CommandLine.arguments.count == 2 else {
    FileHandle.standardError.write("usage: edge-run BUNDLE_DIR\n".data(using: .utf8)!)
    exit(2)
}
let bundle = try EdgeBundle(url: URL(fileURLWithPath: CommandLine.arguments[1]))
var inputs: [String: Data] = [:]
for spec in bundle.manifest.inputs {
    precondition(spec.dtype == "float32", "edge-run feeds float32 inputs only")
    inputs[spec.name] = [Float](repeating: 1, count: spec.count).withUnsafeBufferPointer { Data(buffer: $0) }
}
let outputs = try bundle.run(inputs)
for spec in bundle.manifest.outputs {
    let values = outputs[spec.name]!.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
    print("\(spec.name) \(spec.shape) sum=\(values.reduce(0, +))")
}
