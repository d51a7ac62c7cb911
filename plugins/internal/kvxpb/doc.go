// Package kvxpb is the generated Go code of the kvx plugin protocol v1
// (plugins/proto/kvx/v1/kvx.proto). It is internal: plugin authors and the core
// use the hand-written types of plugins/v1/{kvcache,worker,spec}, and
// plugins/v1/pluginrpc converts between the two forms.
//
// Do not edit the *.pb.go files; change the .proto and run `make proto`.
// stale_test.go fails when the committed files differ from what the pinned
// generators produce.
package kvxpb
