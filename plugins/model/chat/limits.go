package chat

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	gtokens "github.com/nikolalohinski/gonja/v2/tokens"
)

// Limits a chat template renders under. A template is outside input (a
// checkpoint's tokenizer_config.json, a --chat-template file), and gonja
// has no limits of its own: a macro that calls itself overflows the Go
// stack, which kills the process (it cannot be recovered), and a long loop
// holds its request and a core. So that no template can crash, hang or
// exhaust the server, every render is bounded:
//
//   - depth: Parse puts a check at the start of every block
//     body of the template (loop bodies, branches, macro and call bodies,
//     blocks), so that every recursion (a macro calling itself, self.block(),
//     a recursive loop) passes one per level; it measures the render's Go
//     stack and fails past MaxTemplateFrames, long before the stack limit.
//   - steps: the same check counts the block bodies run (loop iterations
//     included) and fails past MaxTemplateSteps;
//   - time: and fails once the render has run MaxTemplateTime;
//   - output: the rendered text may not pass MaxTemplateOutput bytes, and
//     the literal text of the block bodies run (a macro's included, though
//     it is written to the macro's own buffer) may not either;
//   - range() yields at most MaxTemplateRange numbers (gonja's own range
//     feeds a channel from a goroutine that leaks when a loop stops early);
//   - the source may not pass MaxTemplateBytes (the parser recurses on
//     nesting).
//
// Over a limit, that render fails with a *TemplateError wrapping a
// *TemplateLimitError that names the limit, and the server goes on.
// A string times a number and ~ are bounded too (templateMul,
// templateConcat: gonja's 'x' * 10**11 allocated at once, a fatal out of
// memory). Not bounded: the builtins that can build one huge value in one
// step from values within the limits (join, replace, center, ljust,
// indent with a huge width, + on strings or lists).
const (
	MaxTemplateBytes  = 1 << 20
	MaxTemplateSteps  = 200_000 // gonja runs ~130k loop iterations a second
	MaxTemplateFrames = 10_000
	MaxTemplateOutput = 8 << 20
	MaxTemplateRange  = MaxTemplateSteps // a loop over more could not finish
	MaxTemplateTime   = 2 * time.Second
)

// TemplateLimitError is a render stopped at one of the template limits.
type TemplateLimitError struct {
	Limit string // the constant: MaxTemplateSteps, MaxTemplateFrames, ...
	Value int64  // the limit's value (nanoseconds for MaxTemplateTime)
	What  string // what passed it
}

func (e *TemplateLimitError) Error() string {
	v := fmt.Sprint(e.Value)
	if e.Limit == "MaxTemplateTime" {
		v = time.Duration(e.Value).String()
	}
	return fmt.Sprintf("%s passed the limit %s = %s", e.What, e.Limit, v)
}

// budgetKey names the render's *budget in the template's context. A
// template that sets a variable of this name only stops its own render.
const budgetKey = "__kvx_render_budget__"

// budget is one render's account against the limits. The first limit
// passed is kept in err and every later check returns it, so the render
// unwinds at once even where gonja drops an error (a macro's value that is
// never printed).
type budget struct {
	steps    int64
	output   int64
	deadline time.Time
	frames   []uintptr
	err      error
}

func newBudget() *budget {
	return &budget{deadline: time.Now().Add(MaxTemplateTime), frames: make([]uintptr, MaxTemplateFrames+1)}
}

func (b *budget) fail(limit string, value int64, what string) error {
	if b.err == nil {
		b.err = &TemplateLimitError{Limit: limit, Value: value, What: what}
	}
	return b.err
}

// step charges one block body with n bytes of literal text.
func (b *budget) step(n int) error {
	if b.err != nil {
		return b.err
	}
	b.steps++
	b.output += int64(n)
	switch {
	case b.steps > MaxTemplateSteps:
		return b.fail("MaxTemplateSteps", MaxTemplateSteps, "the block bodies run (loop iterations, macro calls, branches)")
	case b.output > MaxTemplateOutput:
		return b.fail("MaxTemplateOutput", MaxTemplateOutput, "the literal text of the block bodies run")
	case time.Now().After(b.deadline): // every step: one can hold a loop's whole item list

		return b.fail("MaxTemplateTime", int64(MaxTemplateTime), "the render's time")
	case b.steps%64 == 0:
		// Recursion adds a block body per level, so checking every 64th
		// step lets at most 64 levels (a few thousand frames, well under
		// the stack limit) pass unseen; measuring costs O(depth).
		if runtime.Callers(0, b.frames) > MaxTemplateFrames {
			return b.fail("MaxTemplateFrames", MaxTemplateFrames, "the render's nesting (macro calls, recursive loops, blocks) in Go stack frames")
		}
	}
	return nil
}

// tick is the check Parse puts at the start of every block
// body: a control structure that charges the render's budget.
type tick struct {
	at   *gtokens.Token
	text int // bytes of literal text directly in the body
}

func (t *tick) Position() *gtokens.Token { return t.at }
func (t *tick) String() string           { return "render limit check" }

// Execute charges the budget of r's render.
func (t *tick) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	v, ok := r.Environment.Context.Get(budgetKey)
	b, isBudget := v.(*budget)
	if !ok || !isBudget {
		return errors.New("the render's limit budget is gone (the template set " + budgetKey + ")")
	}
	return b.step(t.text)
}

var wrapperType = reflect.TypeOf((*nodes.Wrapper)(nil))

// addTicks puts a tick at the start of every block body under root (every
// *nodes.Wrapper reachable through the parsed nodes, unexported fields of
// gonja's control structures included, found by reflection so that each
// of them is covered).
func addTicks(root *nodes.Template) {
	walkNodes(root, func(v reflect.Value, walk func(reflect.Value)) bool {
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Type() != wrapperType {
			return true
		}
		w := (*nodes.Wrapper)(v.UnsafePointer()) // the field may be unexported
		text := 0
		for _, n := range w.Nodes {
			walk(reflect.ValueOf(n))
			if d, ok := n.(*nodes.Data); ok && d.Data != nil {
				text += len(d.Data.Val)
			}
		}
		at := w.Location
		if at == nil {
			at = &gtokens.Token{}
		}
		t := &nodes.ControlStructureBlock{Location: at, Name: "limit", ControlStructure: &tick{at: at, text: text}}
		w.Nodes = append([]nodes.Node{t}, w.Nodes...)
		return false
	})
}

// walkNodes calls visit on root and on every value reachable from it:
// through pointers (each once), interfaces, struct fields (unexported ones
// made settable, tokens skipped), slices, arrays and map values (written
// back on a settable map, read on another). visit returns whether to go on into v's parts;
// when it does not, it may walk them itself with walk.
func walkNodes(root *nodes.Template, visit func(v reflect.Value, walk func(reflect.Value)) bool) {
	seen := map[uintptr]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		if !visit(v, walk) {
			return
		}
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			walk(v.Elem())
		case reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			if v.Type() == tokenType {
				return
			}
			for i := range v.NumField() {
				walk(writable(v.Field(i)))
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(writable(v.Index(i)))
			}
		case reflect.Map:
			if !v.CanSet() {
				for it := v.MapRange(); it.Next(); {
					walk(it.Value())
				}
				return
			}
			for _, k := range v.MapKeys() {
				tmp := reflect.New(v.Type().Elem()).Elem()
				tmp.Set(v.MapIndex(k))
				walk(tmp)
				v.SetMapIndex(k, tmp)
			}
		}
	}
	walk(reflect.ValueOf(root))
}

var tokenType = reflect.TypeOf(gtokens.Token{})

// limitWriter passes writes to w until MaxTemplateOutput bytes have gone
// through, then fails them, charging b.
type limitWriter struct {
	w io.Writer
	n int64
	b *budget
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n+int64(len(p)) > MaxTemplateOutput {
		return 0, l.b.fail("MaxTemplateOutput", MaxTemplateOutput, "the rendered prompt")
	}
	l.n += int64(len(p))
	return l.w.Write(p)
}

// boundedRange is range() yielding at most MaxTemplateRange numbers, as a
// list (gonja's range feeds a channel from a goroutine that leaks when
// the loop over it stops early).
func boundedRange(e *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
	start, stop, step := 0, 0, 1
	ints := true
	for _, a := range params.Args {
		ints = ints && a.IsInteger()
	}
	switch n := len(params.Args); {
	case !ints || n < 1 || n > 3 || len(params.KwArgs) > 0:
		return nil, exec.ErrInvalidCall(errors.New("expected signature is [start, ]stop[, step] where all arguments are integers"))
	case n == 1:
		stop = params.Args[0].Integer()
	default:
		start, stop = params.Args[0].Integer(), params.Args[1].Integer()
		if n == 3 {
			step = params.Args[2].Integer()
		}
	}
	if step == 0 {
		return nil, exec.ErrInvalidCall(errors.New("step cannot be 0"))
	}
	var count int64
	if step > 0 && stop > start {
		count = (int64(stop) - int64(start) + int64(step) - 1) / int64(step)
	} else if step < 0 && stop < start {
		count = (int64(start) - int64(stop) - int64(step) - 1) / -int64(step)
	}
	if count > MaxTemplateRange {
		what := fmt.Sprintf("range(%d, %d, %d) with %d numbers", start, stop, step, count)
		if v, ok := e.Environment.Context.Get(budgetKey); ok {
			if b, ok := v.(*budget); ok {
				return nil, b.fail("MaxTemplateRange", MaxTemplateRange, what)
			}
		}
		return nil, &TemplateLimitError{Limit: "MaxTemplateRange", Value: MaxTemplateRange, What: what}
	}
	out := make([]int, 0, count)
	for i := range count {
		out = append(out, start+int(i)*step)
	}
	return out, nil
}

// templateEnvironment is gonja's default environment with range bounded
// and set kept from making a value that contains itself.
var templateEnvironment = func() *exec.Environment {
	d := gonja.DefaultEnvironment
	ctx := d.Context.Inherit()
	ctx.Set("range", boundedRange)
	ctx.Set(mulName, templateMul)
	ctx.Set(concatName, templateConcat)
	cs := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{})
	cs.Update(d.ControlStructures)
	set, _ := cs.Get("set")
	if err := cs.Replace("set", acyclicSetParser(set)); err != nil {
		panic(err) // gonja has a set statement
	}
	return &exec.Environment{Context: ctx, Filters: d.Filters, Tests: d.Tests, ControlStructures: cs, Methods: d.Methods}
}()

// MaxTemplateCheckedValues bounds the values a set statement's cycle check
// visits; a larger value reached through an attribute or item set fails.
const MaxTemplateCheckedValues = 100_000

// acyclicSetParser wraps gonja's set statement: after {% set ns.x = v %} or
// {% set d[k] = v %} (a namespace or dict changed in place), the variable
// may not contain itself. gonja prints such a value by recursing without
// end, a fatal Go stack overflow that no render limit can catch.
func acyclicSetParser(set parser.ControlStructureParser) parser.ControlStructureParser {
	return func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		root := ""
		if t := args.Current(); t != nil && t.Type == gtokens.Name {
			root = t.Val
		}
		cs, err := set(p, args)
		if err != nil || root == "" {
			return cs, err
		}
		ecs, ok := cs.(exec.ControlStructure)
		if !ok {
			return cs, nil
		}
		return &acyclicSet{ControlStructure: ecs, root: root}, nil
	}
}

// acyclicSet is a set statement whose variable root is checked for cycles
// after it runs.
type acyclicSet struct {
	exec.ControlStructure
	root string
}

func (a *acyclicSet) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	if err := a.ControlStructure.Execute(r, tag); err != nil {
		return err
	}
	v, ok := r.Environment.Context.Get(a.root)
	if !ok {
		return nil
	}
	b, _ := r.Environment.Context.Get(budgetKey)
	bud, _ := b.(*budget)
	c := cycleCheck{onPath: map[[2]uintptr]bool{}, done: map[[2]uintptr]bool{}}
	var err error
	switch cyc := c.cyclic(reflect.ValueOf(v)); {
	case c.visited > MaxTemplateCheckedValues:
		err = &TemplateLimitError{Limit: "MaxTemplateCheckedValues", Value: MaxTemplateCheckedValues,
			What: fmt.Sprintf("the values of %s checked for a cycle after set", a.root)}
	case cyc:
		err = fmt.Errorf("set: %s now contains itself (printing it would recurse without end)", a.root)
	}
	if err != nil && bud != nil {
		if bud.err == nil {
			bud.err = err
		}
		return bud.err
	}
	return err
}

var reflectValueType = reflect.TypeOf(reflect.Value{})

// cycleCheck finds a cycle through maps, slices, pointers, structs and
// the reflect.Value inside gonja's exec.Value.
type cycleCheck struct {
	onPath, done map[[2]uintptr]bool
	visited      int
}

func (c *cycleCheck) cyclic(v reflect.Value) bool {
	if c.visited++; c.visited > MaxTemplateCheckedValues {
		return false
	}
	var key [2]uintptr
	switch v.Kind() {
	case reflect.Interface:
		return !v.IsNil() && c.cyclic(v.Elem())
	case reflect.Pointer, reflect.Map:
		if v.IsNil() {
			return false
		}
		key = [2]uintptr{v.Pointer(), 0}
	case reflect.Slice:
		if v.Len() == 0 {
			return false
		}
		key = [2]uintptr{v.Pointer(), uintptr(v.Len())}
	case reflect.Struct:
		if v.Type() == reflectValueType { // exec.Value.Val
			if !v.CanInterface() {
				return false
			}
			return c.cyclic(v.Interface().(reflect.Value))
		}
		for i := range v.NumField() {
			if c.cyclic(v.Field(i)) {
				return true
			}
		}
		return false
	default:
		return false
	}
	if c.onPath[key] {
		return true
	}
	if c.done[key] {
		return false
	}
	c.onPath[key] = true
	defer func() { delete(c.onPath, key); c.done[key] = true }()
	switch v.Kind() {
	case reflect.Pointer:
		return c.cyclic(v.Elem())
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if c.cyclic(it.Value()) {
				return true
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			if c.cyclic(v.Index(i)) {
				return true
			}
		}
	}
	return false
}

// Limits on a template's shape, checked on its tokens before gonja parses
// it: gonja's parser recurses once or more per nested expression and per
// nested block, and a Go stack overflow is fatal. Real chat templates nest
// blocks a few levels and write tags of a few hundred tokens.
const (
	// MaxTemplateTagTokens bounds the tokens of one tag ({{ ... }} or
	// {% ... %}), so any expression's nesting.
	MaxTemplateTagTokens = 4096
	// MaxTemplateBlockDepth bounds how deep blocks ({% if %}, {% for %},
	// {% macro %}, ...) nest.
	MaxTemplateBlockDepth = 256
)

// blockKeywords are the tags that open a block closed by end<keyword>
// ("set" only without "=": {% set x %}...{% endset %}).
var blockKeywords = map[string]bool{"if": true, "for": true, "macro": true, "call": true, "filter": true, "block": true,
	"with": true, "autoescape": true, "trans": true, "raw": true, "set": true}

// lexTokens is gtokens.LexAll with a bound on the tokens: it runs gonja's
// lexer on its channel and gives up past maxLexTokens of the input. Every
// token but the last takes at least one byte, so a lexer that makes more
// has stopped advancing: gonja v2.9.1's scanNumber, after a number and a
// '.', backs up by the width of the rune that follows rather than the '.',
// so "{%0.\ueab5" lexes without end (LexAll's slice grows until memory
// runs out). The stopped lexer's goroutine stays parked on its channel;
// the template is refused, and a template is parsed once. A panic of the
// lexer (the same inputs can slice out of range) is an error here, as
// Parse makes one of a panic in gonja's parser.
func lexTokens(text string) ([]*gtokens.Token, error) {
	l := gtokens.NewLexer(text, templateConfig)
	fault := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				fault <- p
			}
		}()
		l.Run()
	}()
	limit := maxLexTokens(len(l.Input))
	var toks []*gtokens.Token
	for {
		select {
		case tok, ok := <-l.Tokens:
			if !ok {
				return toks, nil
			}
			if len(toks) == limit {
				return nil, fmt.Errorf("the lexer made more than %d tokens of the template's %d bytes, the limit, at byte %d: it stopped advancing (gonja)",
					limit, len(l.Input), tok.Pos)
			}
			toks = append(toks, tok)
		case p := <-fault:
			return nil, fmt.Errorf("does not lex: gonja panicked: %v", p)
		}
	}
}

// maxLexTokens is the most tokens a lexer that advances makes of n bytes,
// with room to spare.
func maxLexTokens(n int) int { return 2*n + 64 }

// checkShape fails, naming the limit, when a tag of text has more than
// MaxTemplateTagTokens tokens or its blocks nest deeper than
// MaxTemplateBlockDepth, or when the lexer stops advancing (lexTokens).
// Lexing errors are left to the parser.
func checkShape(text string) error {
	toks, err := lexTokens(text)
	if err != nil {
		return err
	}
	s := gtokens.NewStream(toks)
	depth, inTag, n := 0, false, 0
	var keyword string
	assign := false
	for !s.End() {
		tok := s.Next() // the current token; the stream moves on
		switch tok.Type {
		case gtokens.BlockBegin, gtokens.VariableBegin, gtokens.LinecontrolStructureBegin:
			inTag, n, keyword, assign = true, 0, "", false
			continue
		case gtokens.BlockEnd, gtokens.LinecontrolStructureEnd:
			switch {
			case blockKeywords[keyword] && !(keyword == "set" && assign):
				depth++
				if depth > MaxTemplateBlockDepth {
					return &TemplateLimitError{Limit: "MaxTemplateBlockDepth", Value: MaxTemplateBlockDepth,
						What: fmt.Sprintf("the blocks nested at line %d", tok.Line)}
				}
			case len(keyword) > 3 && keyword[:3] == "end" && blockKeywords[keyword[3:]]:
				depth = max(depth-1, 0)
			}
			inTag = false
			continue
		case gtokens.VariableEnd:
			inTag = false
			continue
		}
		if !inTag {
			continue
		}
		if n++; n > MaxTemplateTagTokens {
			return &TemplateLimitError{Limit: "MaxTemplateTagTokens", Value: MaxTemplateTagTokens,
				What: fmt.Sprintf("the tokens of the tag at line %d", tok.Line)}
		}
		if n == 1 && tok.Type == gtokens.Name {
			keyword = tok.Val
		}
		if tok.Type == gtokens.Assign {
			assign = true
		}
	}
	return nil
}

// mulName and concatName are the functions Parse puts in
// place of every multiplication and every ~: gonja's own 'x' * n
// allocates n copies at once, so 'x' * 10**11 was a fatal out of memory,
// a step no check can stop, and a string doubled by ~ in a loop reaches
// gigabytes in 30 steps.
const (
	mulName    = "__kvx_mul__"
	concatName = "__kvx_concat__"
)

// templateConcat is gonja's ~ (both sides as strings, joined) with the
// result bounded by MaxTemplateOutput.
func templateConcat(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	if len(params.Args) != 2 {
		return exec.AsValue(errors.New("~ takes two operands"))
	}
	l, r := params.Args[0].String(), params.Args[1].String()
	if len(l)+len(r) > MaxTemplateOutput {
		return exec.AsValue(outputLimit(e, fmt.Sprintf("a string of %d bytes ~ one of %d", len(l), len(r))))
	}
	return exec.AsValue(l + r)
}

// outputLimit is the MaxTemplateOutput error for what, kept in the
// render's budget.
func outputLimit(e *exec.Evaluator, what string) error {
	if v, ok := e.Environment.Context.Get(budgetKey); ok {
		if b, ok := v.(*budget); ok {
			return b.fail("MaxTemplateOutput", MaxTemplateOutput, what)
		}
	}
	return &TemplateLimitError{Limit: "MaxTemplateOutput", Value: MaxTemplateOutput, What: what}
}

// templateMul is gonja's multiplication (float if either side is a
// float, a repeated string if the left side is a string, else integers)
// with the string's length bounded by MaxTemplateOutput and a negative
// count giving "" (as Python's) instead of gonja's panic.
func templateMul(e *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	if len(params.Args) != 2 {
		return exec.AsValue(errors.New("multiplication takes two operands"))
	}
	l, r := params.Args[0], params.Args[1]
	switch {
	case l.IsFloat() || r.IsFloat():
		return exec.AsValue(l.Float() * r.Float())
	case l.IsString():
		s, n := l.String(), r.Integer()
		if n <= 0 || s == "" {
			return exec.AsValue("")
		}
		if n > MaxTemplateOutput || int64(len(s))*int64(n) > MaxTemplateOutput {
			return exec.AsValue(outputLimit(e, fmt.Sprintf("a string of %d bytes times %d", len(s), n)))
		}
		return exec.AsValue(strings.Repeat(s, n))
	}
	return exec.AsValue(l.Integer() * r.Integer())
}

// writable returns v, made settable when it is addressable (a field of
// gonja's control structures may be unexported).
func writable(v reflect.Value) reflect.Value {
	if v.CanSet() || !v.CanAddr() {
		return v
	}
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}

var callType = reflect.TypeOf((*nodes.Call)(nil))

// guardMultiply replaces every multiplication and ~ under root, wherever
// an expression is held, by a call of templateMul or templateConcat on
// the same operands.
func guardMultiply(root *nodes.Template) {
	walkNodes(root, func(v reflect.Value, walk func(reflect.Value)) bool {
		if v.Kind() != reflect.Interface || v.IsNil() {
			return true
		}
		inner := v.Elem()
		walk(inner)
		if inner.Kind() != reflect.Pointer || inner.Type() != binaryType {
			return false
		}
		be := (*nodes.BinaryExpression)(inner.UnsafePointer())
		if be.Operator == nil || be.Operator.Token == nil || !callType.AssignableTo(v.Type()) || !v.CanSet() {
			return false
		}
		name := ""
		switch be.Operator.Token.Type {
		case gtokens.Multiply:
			name = mulName
		case gtokens.Tilde:
			name = concatName
		default:
			return false
		}
		at := be.Operator.Token
		call := &nodes.Call{Location: at, Func: &nodes.Name{Name: &gtokens.Token{Type: gtokens.Name, Val: name, Line: at.Line, Col: at.Col}},
			Args: []nodes.Expression{be.Left, be.Right}, Kwargs: map[string]nodes.Expression{}}
		v.Set(reflect.ValueOf(call))
		return false
	})
}

var binaryType = reflect.TypeOf((*nodes.BinaryExpression)(nil))
