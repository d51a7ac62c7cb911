package kvcache

import (
	"errors"
	"fmt"
)

// Kind classifies errors that cross the contract. The enum is append-only;
// plugins/v1/pluginrpc maps each kind to one gRPC code and back.
type Kind int

const (
	KindOther         Kind = iota // unclassified
	KindInvalidConfig             // Configure refused the configuration
	KindInvalidArg                // a request item broke the contract (unknown sequence, out of ledger)
	KindUnsupported               // the manager lacks the capability
	KindUnavailable               // the plugin is gone (crash, kill); the call may not have happened
	KindCorrupt                   // manager-wide invariant broken: the engine must stop
)

func (k Kind) String() string {
	switch k {
	case KindInvalidConfig:
		return "invalid config"
	case KindInvalidArg:
		return "invalid argument"
	case KindUnsupported:
		return "unsupported"
	case KindUnavailable:
		return "unavailable"
	case KindCorrupt:
		return "corrupt"
	}
	return "error"
}

// Sentinels; test with errors.Is.
var (
	ErrInvalidConfig = &Error{Kind: KindInvalidConfig}
	ErrInvalidArg    = &Error{Kind: KindInvalidArg}
	ErrUnsupported   = &Error{Kind: KindUnsupported}
	ErrUnavailable   = &Error{Kind: KindUnavailable}
	ErrCorrupt       = &Error{Kind: KindCorrupt}
)

// Error is an error with a Kind. Two *Error values match under errors.Is when
// their kinds are equal, so errors.Is(err, ErrCorrupt) works across gRPC.
type Error struct {
	Kind Kind
	Msg  string
	// Seqs are the sequences the error is about, when it is item-scoped.
	Seqs []SeqID
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Kind.String()
	}
	return e.Msg
}

// Is matches any *Error of the same kind.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Kind == e.Kind
}

// Errorf makes an *Error of kind k.
func Errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// ItemErrorf makes an item-scoped *Error of kind KindInvalidArg about seqs.
func ItemErrorf(seqs []SeqID, format string, args ...any) *Error {
	return &Error{Kind: KindInvalidArg, Msg: fmt.Sprintf(format, args...), Seqs: seqs}
}

// KindOf returns the kind of err, KindOther when it carries none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindOther
}
