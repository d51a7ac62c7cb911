package cachemgrv2

import "fmt"

// Ledger is one sequence's token accounting, the single place where capacity
// and history move (kvcache package doc, "The ledger"). It is plain
// arithmetic: the Manager turns capacities into blocks, ceil(Capacity/tpb) per
// pool group.
//
// Invariant at every observable point: 0 <= History <= Capacity, and
// Capacity == max(History, Hold) when no reservation is outstanding. History
// only grows. The reservation (Tokens, Draft) is recorded when it is made, and
// Commit releases rejected drafts from that record, never from a width the
// caller recomputes: so Commit can never ask for capacity below history.
type Ledger struct {
	History  int // tokens whose KV is final
	Capacity int // token slots backed by blocks
	Hold     int // capacity kept until release whatever Commit does
	Tokens   int // outstanding reservation: tokens written after History
	Draft    int // outstanding reservation: draft tokens after Tokens
	Reserved bool

	undoCap, undoHold int
}

// Need is the capacity a reservation of tokens and draft with hold requires.
func (l *Ledger) Need(tokens, draft, hold int) int {
	return max(l.Capacity, l.History+tokens+draft, l.Hold, hold)
}

// Reserve records a reservation (the caller has checked that none is
// outstanding and that Need fits) and returns the new capacity.
func (l *Ledger) Reserve(tokens, draft, hold int) int {
	l.undoCap, l.undoHold = l.Capacity, l.Hold
	l.Capacity = l.Need(tokens, draft, hold)
	l.Hold = max(l.Hold, hold)
	l.Tokens, l.Draft, l.Reserved = tokens, draft, true
	return l.Capacity
}

// Unreserve restores the ledger to what it was before Reserve.
func (l *Ledger) Unreserve() {
	l.Capacity, l.Hold = l.undoCap, l.undoHold
	l.Tokens, l.Draft, l.Reserved = 0, 0, false
}

// CheckCommit says why Commit(accepted) would break the contract; "" when it
// is valid: a reservation is outstanding and Tokens <= accepted <= Tokens+Draft.
func (l *Ledger) CheckCommit(accepted int) string {
	switch {
	case !l.Reserved:
		return fmt.Sprintf("accepted %d without an outstanding reservation", accepted)
	case accepted < l.Tokens:
		return fmt.Sprintf("accepted %d < reserved tokens %d", accepted, l.Tokens)
	case accepted > l.Tokens+l.Draft:
		return fmt.Sprintf("accepted %d > reserved tokens %d + draft %d", accepted, l.Tokens, l.Draft)
	}
	return ""
}

// Commit advances History by accepted (valid per CheckCommit) and shrinks
// Capacity to max(History, Hold), releasing the rejected drafts. It returns
// the new capacity, which never exceeds the old one.
func (l *Ledger) Commit(accepted int) int {
	l.History += accepted
	l.Capacity = max(l.History, l.Hold)
	l.Tokens, l.Draft, l.Reserved = 0, 0, false
	return l.Capacity
}
