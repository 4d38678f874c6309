import Foundation

/// `bundle/manifest.json` (schemas/bundle.schema.json), version 1.
public struct Manifest: Decodable {
    public let format: String
    public let version: Int
    public let name: String
    public let inputs: [TensorSpec]
    public let outputs: [TensorSpec]
    public let segments: [SegmentSpec]
    public let handoffs: [HandOff]

    public static func load(from bundle: URL) throws -> Manifest {
        let data = try Data(contentsOf: bundle.appendingPathComponent("manifest.json"))
        let manifest = try JSONDecoder().decode(Manifest.self, from: data)
        guard manifest.format == "edgebuild-bundle", manifest.version == 1 else {
            throw EdgeError.unsupported("manifest \(manifest.format) version \(manifest.version)")
        }
        return manifest
    }
}

public struct TensorSpec: Decodable {
    public let name: String
    public let dtype: String
    public let shape: [Int]
    public let layout: String
    public let binding: String?

    /// The name the segment's artifact uses for this tensor.
    public var key: String { binding ?? name }
    public var count: Int { shape.reduce(1, *) }
    public var byteCount: Int { count * DType(dtype).size }
}

public struct SegmentSpec: Decodable {
    public let index: Int
    public let backend: String
    public let path: String
    public let files: [String: String]
    public let compute_units: String
    public let inputs: [TensorSpec]
    public let outputs: [TensorSpec]
}

public struct HandOff: Decodable {
    public let tensor: String
    public let from_segment: Int?
    public let to_segment: Int?
}

public enum EdgeError: Error {
    case unsupported(String)
    case missing(String)
    case metal(String)
}

/// Element types at segment borders, with their sizes in bytes.
public struct DType {
    public let name: String
    public init(_ name: String) { self.name = name }
    public var size: Int {
        switch name {
        case "float32", "int32": return 4
        case "float16", "int16": return 2
        case "int64": return 8
        default: return 1  // int8, uint8, bool
        }
    }
}
