package pluginrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// kindCodes is the one mapping between kvcache.Kind and gRPC codes. Kinds
// are append-only; a kind missing here travels as codes.Unknown and comes
// back as KindOther.
var kindCodes = [...]struct {
	kind kvcache.Kind
	code codes.Code
}{
	{kvcache.KindOther, codes.Unknown},
	{kvcache.KindInvalidConfig, codes.FailedPrecondition},
	{kvcache.KindInvalidArg, codes.InvalidArgument},
	{kvcache.KindUnsupported, codes.Unimplemented},
	{kvcache.KindUnavailable, codes.Unavailable},
	{kvcache.KindCorrupt, codes.DataLoss},
}

// codeOf returns the gRPC code of kind k.
func codeOf(k kvcache.Kind) codes.Code {
	for _, kc := range kindCodes {
		if kc.kind == k {
			return kc.code
		}
	}
	return codes.Unknown
}

// kindOf returns the kind of gRPC code c (KindOther for codes outside the
// table).
func kindOf(c codes.Code) kvcache.Kind {
	for _, kc := range kindCodes {
		if kc.code == c {
			return kc.kind
		}
	}
	return kvcache.KindOther
}

// toStatus turns an implementation's error into the gRPC status error the
// server returns. The status always carries an ErrorDetail, which marks it as
// the plugin's answer rather than a transport failure. A non-empty partial
// (the result returned together with err) is attached as a second detail.
func toStatus(err error, partial proto.Message) error {
	code := codes.Unknown
	msg := err.Error()
	var seqs []uint64
	var ke *kvcache.Error
	switch {
	case errors.As(err, &ke):
		code = codeOf(ke.Kind)
		if ke == err { // keep Msg exactly, even when empty
			msg = ke.Msg
		}
		seqs = fromSeqIDs(ke.Seqs)
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	details := []protoadapt.MessageV1{&kvxpb.ErrorDetail{Seqs: seqs}}
	if partial != nil && proto.Size(partial) > 0 {
		details = append(details, protoadapt.MessageV1Of(partial))
	}
	st, derr := status.New(code, msg).WithDetails(details...)
	if derr != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

// fromStatus turns the error of a gRPC call into the error the client
// returns, and fills partial from the status when the plugin sent a result
// together with its error. done is the plugin's lifetime (nil: unknown).
//
//   - the caller's ctx ended (the call was cancelled or timed out, on
//     either side): an error wrapping ctx.Err();
//   - the plugin's own error: *kvcache.Error with the kind of the code, the
//     message and the Seqs;
//   - the plugin process exited, the connection broke or was closed, or the
//     call was cancelled while the caller's ctx is live: KindUnavailable;
//   - the plugin does not serve the method: KindUnsupported;
//   - anything else: the kind of the code.
func fromStatus(ctx context.Context, done <-chan struct{}, method string, err error, partial proto.Message) error {
	st, ok := status.FromError(err)
	if !ok {
		return &kvcache.Error{Kind: kvcache.KindOther, Msg: fmt.Sprintf("kvx plugin %s: %v", method, err)}
	}
	code := st.Code()
	var detail *kvxpb.ErrorDetail
	for _, a := range st.Proto().GetDetails() {
		switch {
		case detail == nil && a.MessageIs((*kvxpb.ErrorDetail)(nil)):
			detail = new(kvxpb.ErrorDetail)
			if a.UnmarshalTo(detail) != nil {
				detail = nil
			}
		case partial != nil && a.MessageIs(partial):
			unmarshalPartial(a, partial)
		}
	}
	if code == codes.Canceled || code == codes.DeadlineExceeded {
		if err := plane.CtxErr(ctx); err != nil {
			return fmt.Errorf("kvx plugin %s: %w", method, err)
		}
	}
	switch {
	case detail != nil && code != codes.Canceled && code != codes.DeadlineExceeded:
		return &kvcache.Error{Kind: kindOf(code), Msg: st.Message(), Seqs: toSeqIDs(detail.GetSeqs())}
	case exited(done), code == codes.Canceled, code == codes.DeadlineExceeded:
		// Cancelled while our ctx is live: the connection was closed under
		// the call (the plugin was killed) or the plugin is stopping.
		return &kvcache.Error{Kind: kvcache.KindUnavailable,
			Msg: fmt.Sprintf("kvx plugin %s: plugin unavailable: %s", method, st.Message())}
	case code == codes.Unimplemented:
		return &kvcache.Error{Kind: kvcache.KindUnsupported,
			Msg: fmt.Sprintf("kvx plugin %s: not served by this plugin: %s", method, st.Message())}
	}
	return &kvcache.Error{Kind: kindOf(code), Msg: fmt.Sprintf("kvx plugin %s: %s: %s", method, code, st.Message())}
}

func unmarshalPartial(a *anypb.Any, partial proto.Message) {
	if a.UnmarshalTo(partial) != nil {
		proto.Reset(partial)
	}
}

// exited reports whether done is closed; a nil done never is.
func exited(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// errExited is what a client returns without calling once the plugin is gone.
func errExited(method string) error {
	return &kvcache.Error{Kind: kvcache.KindUnavailable,
		Msg: fmt.Sprintf("kvx plugin %s: plugin process exited", method)}
}

// malformed is what a client returns when a plugin's answer breaks the
// protocol (a columnar message whose columns do not line up).
func malformed(method string, err error) error {
	return &kvcache.Error{Kind: kvcache.KindOther, Msg: fmt.Sprintf("kvx plugin %s: malformed answer: %v", method, err)}
}

// answerOf decodes the answer of a call to method: from(resp) when the call
// succeeded (a decode failure is malformed), and when it failed the error
// (fromStatus) beside the partial answer its status carries, decoded by
// from, whose own failure then leaves the zero value.
func answerOf[R any, M any, PM interface {
	*M
	proto.Message
}](ctx context.Context, done <-chan struct{}, method string, resp PM, err error, from func(PM) (R, error)) (R, error) {
	if err != nil {
		partial := PM(new(M))
		err = fromStatus(ctx, done, method, err, partial)
		r, _ := from(partial)
		return r, err
	}
	r, err := from(resp)
	if err != nil {
		var zero R
		return zero, malformed(method, err)
	}
	return r, nil
}
