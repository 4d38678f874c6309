// swift-tools-version:5.9
import PackageDescription

let package = Package(
    name: "EdgeRuntime",
    platforms: [.macOS(.v15), .iOS(.v18)],  // MPSGraph scaledDotProductAttention needs macOS 15 / iOS 18
    products: [
        .library(name: "EdgeRuntime", targets: ["EdgeRuntime"]),
        .executable(name: "edge-run", targets: ["edge-run"]),
    ],
    targets: [
        .target(name: "EdgeRuntime"),
        .executableTarget(name: "edge-run", dependencies: ["EdgeRuntime"]),
    ]
)
