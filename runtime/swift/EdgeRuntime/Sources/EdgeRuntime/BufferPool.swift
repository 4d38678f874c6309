import Foundation
import Metal

/// Reuses shared-storage MTLBuffers between runs. Sizes round up to a power of two, so a
/// tensor of 3,000 bytes and one of 4,000 share the 4 KiB bucket; a released buffer goes back
/// to its bucket instead of the allocator. Shared storage is unified memory on Apple silicon:
/// the CPU, the GPU (MPSGraph, Metal kernels) and Core ML (MLMultiArray over the same bytes)
/// all read one allocation, so hand-offs between segments copy nothing.
public final class BufferPool {
    private let device: MTLDevice
    private var free: [Int: [MTLBuffer]] = [:]
    private let lock = NSLock()

    public init(device: MTLDevice) { self.device = device }

    static func bucket(for bytes: Int) -> Int {
        var size = 16
        while size < bytes { size <<= 1 }
        return size
    }

    public func acquire(bytes: Int) throws -> MTLBuffer {
        let size = Self.bucket(for: bytes)
        lock.lock()
        defer { lock.unlock() }
        if let buffer = free[size]?.popLast() { return buffer }
        guard let buffer = device.makeBuffer(length: size, options: .storageModeShared) else {
            throw EdgeError.metal("cannot allocate \(size) bytes")
        }
        return buffer
    }

    public func release(_ buffer: MTLBuffer) {
        lock.lock()
        free[buffer.length, default: []].append(buffer)
        lock.unlock()
    }
}

